"""Optimizer specs: from a torch.optim object or from the legacy params ``optimizer:`` section.

The device runs its own implementation of each legacy optimizer type, built from the
:class:`~csrun.program.spec.OptimizerSpec`; the user's optimizer object only tells which type
and which hyperparameters. :func:`state_slots` says how many parameter-sized state tensors
each type keeps (for the wafer memory budget).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Collection, Mapping, Sequence

import torch

from csrun.compiler.errors import ConfigError, Location, UnsupportedOptimizer
from csrun.compiler.locate import caller_location, definition_location
from csrun.compiler.spec import OptimizerSpec
from csrun.program import optimizers as table
from csrun.program.optimizer_classes import TENSOR_LR
from csrun.program.optimizer_config import OptimizerConfig, read_optimizer_section

_IMPLEMENTATION_KEYS = frozenset({
    "params", "lr", "initial_lr", "foreach", "fused", "capturable", "differentiable", "decoupled_weight_decay",
})
"""param_group keys that are not hyperparameters of the update rule (``decoupled_weight_decay``
is carried by the type instead: torch's Adam with it on is AdamW; NAdam's and RAdam's is a
hyperparameter: :attr:`csrun.program.optimizers.Optimizer.decoupled_flag`)."""

def legacy_type_of(optimizer: torch.optim.Optimizer) -> str | None:
    """The legacy type of a torch optimizer object, or None when the system has none.

    torch.optim classes map by :data:`csrun.program.optimizers.TORCH_CLASSES`; a class that declares
    a ``legacy_type`` attribute (the engine's own, which the runner builds) is that type; a custom
    class counts when its name (or a base class's) is a legacy type (e.g. a user ``Lamb``): the
    device runs its own implementation.
    """
    for klass in type(optimizer).__mro__:
        declared = klass.__dict__.get("legacy_type")
        if isinstance(declared, str) and declared in table.OPTIMIZERS:
            return declared  # the engine's own classes (e.g. AdamW without bias correction)
        if klass.__module__.startswith("torch.optim"):
            if klass.__name__ in table.TORCH_CLASSES:
                return table.TORCH_CLASSES[klass.__name__]
        elif klass.__name__.lower() in table.OPTIMIZERS:
            return klass.__name__.lower()
    return None


def is_torch_builtin(optimizer: torch.optim.Optimizer) -> bool:
    """True when the optimizer's update is not the user's code: its class is defined inside
    torch.optim, or its ``step()`` is torch.optim's or the engine's own (cstorch's classes)."""
    step_module = getattr(getattr(type(optimizer), "step", None), "__module__", None) or ""
    return type(optimizer).__module__.startswith("torch.optim") or \
        step_module.startswith(("torch.optim", "csrun.program.optimizer_classes"))


def _json_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, (tuple, list)):
        return [_json_value(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(type(value).__name__)


def _hyperparameters(group: Mapping[str, Any], known: Collection[str]) -> dict[str, Any]:
    """A param group's hyperparameters: the keys its optimizer's ``defaults`` name (an LR scheduler
    keeps its own bookkeeping in the groups too: ``initial_lr``, ``max_lr``, ``base_momentum`` ...)."""
    out: dict[str, Any] = {}
    for k, v in group.items():
        if k in _IMPLEMENTATION_KEYS or k not in known:
            continue
        try:
            out[k] = _json_value(v)
        except TypeError:
            continue  # not data (a callable etc.): the device cannot use it anyway
    return out


def unsupported_optimizer_error(optimizer: torch.optim.Optimizer) -> UnsupportedOptimizer:
    """The error for an optimizer the system lacks, located at its class (custom) or the caller."""
    cls = type(optimizer)
    loc: Location | None = None if is_torch_builtin(optimizer) else definition_location(cls)
    own = " or ".join(f"a class named {o.class_name}" for o in table.OPTIMIZERS.values() if not o.in_torch)
    return UnsupportedOptimizer(
        f"optimizer {cls.__module__}.{cls.__qualname__} is not one the system has",
        fix="use one of: " + ", ".join(table.NAMES) + " (torch.optim." + ", ".join(table.TORCH_CLASSES) + f", or {own})",
        location=loc or caller_location())


def optimizer_spec_from_torch(optimizer: torch.optim.Optimizer, *, model: torch.nn.Module | None = None,
                              learning_rates: Sequence[Any] | None = None) -> OptimizerSpec:
    """The :class:`OptimizerSpec` of a torch optimizer object.

    Hyperparameters come from the first param group (``lr`` excluded: the schedule is the
    program's ``learning_rate``). ``param_groups`` lists each group's parameter names (from
    ``model``; positions ``"#i"`` without it) with the hyperparameters that differ from the first
    group's, and ``learning_rate`` where ``learning_rates`` (one legacy learning-rate value per
    group) gives the group a schedule of its own; it is empty when one group holds every
    trainable parameter of ``model``. ``learning_rates`` None: every group follows the program's
    one schedule (a schedule of the compile settings, which set every group's lr on the CPU too).
    Raises :class:`UnsupportedOptimizer` for a type the system does not have.
    """
    kind = legacy_type_of(optimizer)
    if kind is None:
        raise unsupported_optimizer_error(optimizer)
    groups = optimizer.param_groups
    if kind == "adam" and groups[0].get("decoupled_weight_decay"):
        kind = "adamw"
    if kind == "sgd" and any(g.get("momentum") and g.get("dampening") for g in groups):
        raise UnsupportedOptimizer(
            "SGD with momentum and dampening: torch starts the momentum from the first gradient undamped, the "
            "system's optimizer state exists before the first step (so the first step would be damped)",
            fix="use dampening=0 (the system's SGD), or no momentum", location=caller_location())
    known = set(optimizer.defaults)
    base = {**_hyperparameters(groups[0], known), **getattr(type(optimizer), "legacy_hyperparameters", {})}
    if table.OPTIMIZERS[kind].decoupled_flag and groups[0].get("decoupled_weight_decay"):
        base["decoupled_weight_decay"] = True
    lr = groups[0].get("lr")
    if isinstance(lr, torch.Tensor):
        base[TENSOR_LR] = str(lr.dtype).removeprefix("torch.")
    if learning_rates is not None and len(learning_rates) != len(groups):
        raise ValueError(f"{len(learning_rates)} learning rates for {len(groups)} param groups")  # a csrun bug
    names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
    param_groups: list[dict[str, Any]] = []
    index = 0
    for i, g in enumerate(groups):
        hp = _hyperparameters(g, known)
        entry: dict[str, Any] = {k: v for k, v in hp.items() if base.get(k) != v}
        if learning_rates is not None and learning_rates[i] != learning_rates[0]:
            entry["learning_rate"] = learning_rates[i]
        pnames = []
        for p in g["params"]:
            if model is None or id(p) in names:  # else a weight the model no longer has (replaced since): not trained
                pnames.append(names.get(id(p), f"#{index}"))
            index += 1
        param_groups.append({"params": pnames, **entry})
    if len(param_groups) == 1 and _holds_every_trainable(optimizer, model):
        param_groups = []
    return OptimizerSpec(type=kind, hyperparameters=base, param_groups=tuple(param_groups))


def _holds_every_trainable(optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> bool:
    """Whether the optimizer's groups hold exactly the model's trainable parameters (without the
    model: assumed). A parameter the optimizer leaves out is not trained, on the CPU or the device."""
    if model is None:
        return True
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    return held == {id(p) for p in model.parameters() if p.requires_grad}


def group_learning_rates(optimizer: torch.optim.Optimizer) -> list[float]:
    """Each param group's constant learning rate (its ``lr``), as the program's schedules."""
    return [float(g["lr"].item() if isinstance(g["lr"], torch.Tensor) else g["lr"]) for g in optimizer.param_groups]


def optimizer_spec_from_config(config: OptimizerConfig) -> OptimizerSpec:
    """The :class:`OptimizerSpec` of a checked params ``optimizer:`` section: the one translation.

    The hyperparameters are :func:`csrun.program.optimizers.spec_hyperparameters` of the section
    (the type's own keys at their value or default, legacy keys under torch's names). Learning
    rate, loss scaling, clipping and accumulation go into the compile settings
    (:func:`csrun.compiler.settings.settings_from_config`), not here.
    """
    try:
        hp = table.spec_hyperparameters(dataclasses.asdict(config))
    except ValueError as exc:
        raise ConfigError(f"optimizer: {exc}") from None
    return OptimizerSpec(type=config.optimizer_type.lower(), hyperparameters=hp)


def optimizer_spec_from_params(section: Mapping[str, Any]) -> OptimizerSpec:
    """:func:`optimizer_spec_from_config` of a params ``optimizer:`` mapping as written in YAML.

    The section is read by :func:`csrun.program.optimizer_config.read_optimizer_section` (the
    typed config run.py reads it with: unknown keys, wrong types and a missing
    ``learning_rate`` are :class:`ConfigError`); an ``optimizer_type`` the system does not have
    is :class:`UnsupportedOptimizer`.
    """
    raw_type = section.get("optimizer_type") if isinstance(section, Mapping) else None
    if isinstance(raw_type, str) and raw_type.lower() not in table.OPTIMIZERS:
        raise UnsupportedOptimizer(f"optimizer_type {raw_type!r} is not one the system has",
                                   fix="use one of: " + ", ".join(table.NAMES))
    return optimizer_spec_from_config(read_optimizer_section(section))


def state_slots(spec: OptimizerSpec | None) -> float:
    """Parameter-sized state tensors the optimizer keeps per weight (for the memory budget).

    :func:`csrun.program.optimizers.state_slots`: e.g. sgd 1 with momentum else 0, the Adam
    family 2 (amsgrad +1), adafactor's factored second moments counted as 0.1 of a slot (an
    estimate). None (eval): 0.
    """
    if spec is None:
        return 0.0
    return table.state_slots(spec.type, spec.hyperparameters)
