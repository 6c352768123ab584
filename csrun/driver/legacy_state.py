"""The legacy checkpoint state: ``{"model", "optimizer", "amp", "global_step"}``.

``cbtorch.get_state()`` returns, and ``cbtorch.set_state()`` takes, the dict the legacy
``checkpoint_<step>.mdl`` files held (less ``lr_scheduler``, which the runner adds):

``model``
    the model's ``state_dict()`` (names as in the user's module, tied weights under every name);
``optimizer``
    a torch optimizer ``state_dict()``, numbered as the user's torch optimizer numbers its
    parameters (so a state saved on the device loads on the CPU and back);
``amp``
    the loss scaler's state (``{}`` on the CPU, which has no scaler);
``global_step``
    optimizer steps taken.

The device keeps its own layout (:meth:`csrun.emulator.engine.executor.Engine.state_dict`:
``params``/``buffers``/``param_names``/``optimizer``/``scaler``/``global_step``);
:func:`from_device` and :func:`to_device` translate, by parameter name. All tensors returned
are copies: training on does not change a state already taken.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch.utils import _pytree as pytree

from csrun.errors import UserError

KEYS = ("model", "optimizer", "amp", "global_step")


class StateError(UserError):
    """A state given to ``set_state`` that does not fit the model or optimizer."""


def _copy(obj: Any) -> Any:
    return pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, obj)


def check(state: Any) -> Mapping[str, Any]:
    """Refuse anything but a legacy state mapping (``model`` required, other keys optional)."""
    if not isinstance(state, Mapping) or "model" not in state:
        got = sorted(map(str, state)) if isinstance(state, Mapping) else type(state).__name__
        raise StateError(f"set_state needs the dict get_state() returns, with keys {list(KEYS)}; got {got}")
    step_of(state)
    return state


def step_of(state: Mapping[str, Any]) -> int:
    """The state's ``global_step`` as an int (a Python, numpy or 0-d tensor integer >= 0)."""
    step = state.get("global_step", 0)
    try:
        if isinstance(step, (bool, float, str)):
            raise TypeError
        value = int(step.item()) if isinstance(step, torch.Tensor) and not step.is_floating_point() else int(step)
    except (TypeError, ValueError, RuntimeError):
        value = -1
    if value < 0:
        raise StateError(f"state global_step must be an integer >= 0, got {step!r}")
    return value


def param_order(model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None) -> list[str] | None:
    """Parameter names in the user optimizer's numbering (``#i`` for one the model no longer has:
    a weight replaced since, which no device weight's name matches); None without both."""
    if model is None or optimizer is None:
        return None
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of.get(id(p), f"#{i}") for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])]


def eager_state(model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None, global_step: int) -> dict:
    """The state of an eager (CPU) run."""
    return {"model": _copy(model.state_dict()) if model is not None else {},
            "optimizer": _copy(optimizer.state_dict()) if optimizer is not None else {},
            "amp": {}, "global_step": int(global_step)}


def load_eager(model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None, state: Mapping[str, Any], *,
               strict: bool, load_optimizer: bool) -> None:
    """Load a state into an eager model and optimizer (``amp`` is ignored: no scaler on the CPU)."""
    if model is None:
        raise StateError("set_state needs the model: call cbtorch.module(model) first")
    try:
        model.load_state_dict(state["model"], strict=strict)
    except RuntimeError as exc:
        raise StateError(f"set_state: the state's model does not fit this model: {exc}") from None
    if load_optimizer and optimizer is not None and state.get("optimizer"):
        try:
            optimizer.load_state_dict(_copy(state["optimizer"]))
        except (ValueError, KeyError) as exc:
            raise StateError(f"set_state: the state's optimizer does not fit this optimizer: {exc}") from None


def _aliases(model: torch.nn.Module | None) -> dict[str, list[str]]:
    """For each state_dict name of ``model``: every name sharing its tensor (tied weights)."""
    if model is None:
        return {}
    groups: dict[int, list[str]] = {}
    for n, t in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False)):
        groups.setdefault(id(t), []).append(n)
    return {n: names for names in groups.values() for n in names}


def from_device(dev: Mapping[str, Any], model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None, *,
                own_learning_rates: bool = False) -> dict:
    """The legacy state from a device state (``Device.state_dict()``); ``own_learning_rates``:
    each group's ``lr`` is the user optimizer's (torch schedulers keep it where eager would have
    it: the next step's), not the one the device used last."""
    tensors = {**dev.get("params", {}), **dev.get("buffers", {})}
    if model is not None:
        aliases = _aliases(model)
        out_model = {}
        for name in model.state_dict():
            src = next((a for a in [name, *aliases.get(name, [])] if a in tensors), None)
            if src is not None:
                out_model[name] = tensors[src].detach().clone()
    else:
        out_model = {n: t.detach().clone() for n, t in tensors.items()}
    opt_state = dev.get("optimizer") or {}
    names = param_order(model, optimizer)
    if opt_state and names is not None and optimizer is not None:
        where = {n: i for i, n in enumerate(names)}
        state = {where[n]: _copy(opt_state["state"][i]) for i, n in enumerate(dev.get("param_names", []))
                 if n in where and i in opt_state.get("state", {})}
        groups = _copy(optimizer.state_dict()["param_groups"])
        if not own_learning_rates:
            _device_learning_rates(groups, opt_state.get("param_groups") or [], names, dev.get("param_names", []))
        opt_out: dict = {"state": state, "param_groups": groups}
    else:
        opt_out = _copy(opt_state) if opt_state else {}
    return {"model": out_model, "optimizer": opt_out, "amp": dict(dev.get("scaler") or {}),
            "global_step": int(dev.get("global_step", 0))}


def _device_learning_rates(groups: list[dict[str, Any]], dev_groups: list[dict[str, Any]], names: list[str],
                           dev_names: list[str]) -> None:
    """Each user param group's ``lr`` from the device group holding one of its weights (the first
    the device has: a frozen weight is in no device group; the device's groups number their
    weights in ``dev_names`` order, group after group)."""
    group_of: dict[str, int] = {}
    at = 0
    for i, g in enumerate(dev_groups):
        for _ in g.get("params", ()):
            if at < len(dev_names):
                group_of[dev_names[at]] = i
            at += 1
    for g in groups:
        found = next((group_of[names[k]] for k in g.get("params", ()) if names[k] in group_of), None)
        if found is not None and found < len(dev_groups) and "lr" in dev_groups[found]:
            g["lr"] = dev_groups[found]["lr"]


def renamed(dev: Mapping[str, Any], renames: Mapping[str, str], dropped: set[str]) -> dict[str, Any]:
    """A device state with its weights' names changed by ``renames`` (old -> new), where the model
    calls a weight otherwise since the program was loaded (pruning, a parametrization), and without
    the values of ``dropped`` (weights the model replaced since: the model's new ones stand)."""
    out = dict(dev)
    if not renames and not dropped:
        return out
    for key in ("params", "buffers"):
        if isinstance(out.get(key), dict):
            out[key] = {renames.get(n, n): t for n, t in out[key].items() if n not in dropped}
    for key in ("param_names", "gradients_held"):
        if isinstance(out.get(key), list):
            out[key] = [renames.get(n, n) for n in out[key]]
    return out


def to_device(state: Mapping[str, Any], template: Mapping[str, Any], model: torch.nn.Module | None,
              optimizer: torch.optim.Optimizer | None, *, strict: bool) -> dict:
    """A device state from a legacy one; ``template`` is the device's current ``state_dict()``
    (it gives the device's names, optimizer numbering and param groups)."""
    given = dict(state["model"])
    aliases = _aliases(model)
    wanted = list(template.get("params", {})) + list(template.get("buffers", {}))
    params: dict[str, torch.Tensor] = {}
    buffers: dict[str, torch.Tensor] = {}
    missing = []
    for kind, into in (("params", params), ("buffers", buffers)):
        for name in template.get(kind, {}):
            src = next((a for a in [name, *aliases.get(name, [])] if a in given), None)
            if src is None:
                missing.append(name)
            else:
                into[name] = given[src]
    covered = {a for n in wanted for a in [n, *aliases.get(n, [])]}
    unexpected = sorted(set(given) - covered)
    non_persistent = set(template.get("buffers", {})) - (set(model.state_dict()) if model is not None else set())
    missing = [m for m in missing if m not in non_persistent]
    if strict and (missing or unexpected):
        raise StateError(f"set_state: the state's model does not fit the model on the device: missing keys "
                         f"{missing}, unexpected keys {unexpected} (pass strict=False to load what fits)")
    out: dict[str, Any] = {"params": params, "buffers": buffers, "global_step": step_of(state),
                           "optimizer": None, "scaler": dict(state["amp"]) if state.get("amp") else None}
    opt = state.get("optimizer")
    dev_opt = template.get("optimizer")
    if opt and dev_opt:
        names = param_order(model, optimizer)
        if names is not None:
            where = {n: i for i, n in enumerate(names)}
            src_state = opt.get("state", {})
            mapped = {i: src_state[where[n]] for i, n in enumerate(template.get("param_names", []))
                      if n in where and where[n] in src_state}
        else:
            mapped = dict(opt.get("state", {}))
        out["optimizer"] = {"state": _copy(mapped), "param_groups": _copy(dev_opt["param_groups"])}
    return out
