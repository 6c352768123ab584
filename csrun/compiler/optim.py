"""Optimizer specs: from a torch.optim object or from the legacy params ``optimizer:`` section.

The device runs its own implementation of each legacy optimizer type, built from the
:class:`~csrun.program.spec.OptimizerSpec`; the user's optimizer object only tells which type
and which hyperparameters. :func:`state_slots` says how many parameter-sized state tensors
each type keeps (for the wafer memory budget).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from csrun.compiler.errors import ConfigError, Location, UnsupportedOptimizer
from csrun.compiler.locate import caller_location, definition_location
from csrun.compiler.spec import OptimizerSpec
from csrun.program import optimizers as table

_IMPLEMENTATION_KEYS = frozenset({
    "params", "lr", "initial_lr", "foreach", "fused", "capturable", "differentiable", "decoupled_weight_decay",
})
"""param_group keys that are not hyperparameters of the update rule (``decoupled_weight_decay``
is carried by the type instead: torch's Adam with it on is AdamW)."""

_PARAMS_KEYS = table.HYPERPARAMETER_KEYS | {
    "optimizer_type", "learning_rate", "loss_scaling_factor", "initial_loss_scale", "steps_per_increase",
    "min_loss_scale", "max_loss_scale", "max_gradient_norm", "max_gradient_value", "grad_accum_steps",
}
"""Keys the legacy ``optimizer:`` section may hold."""


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
    """True when the optimizer's class is defined inside torch.optim (not the user's code)."""
    return type(optimizer).__module__.startswith("torch.optim")


def _json_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, (tuple, list)):
        return [_json_value(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(type(value).__name__)


def _hyperparameters(group: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in group.items():
        if k in _IMPLEMENTATION_KEYS:
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


def optimizer_spec_from_torch(optimizer: torch.optim.Optimizer, *, model: torch.nn.Module | None = None) -> OptimizerSpec:
    """The :class:`OptimizerSpec` of a torch optimizer object.

    Hyperparameters come from the first param group (``lr`` excluded: see
    :func:`learning_rate_from_torch`). With several groups that differ, ``param_groups`` lists
    each group's parameter names (from ``model``; positions ``"#i"`` without it) and the keys
    that differ. Raises :class:`UnsupportedOptimizer` for a type the system does not have.
    """
    kind = legacy_type_of(optimizer)
    if kind is None:
        raise unsupported_optimizer_error(optimizer)
    groups = optimizer.param_groups
    if kind == "adam" and groups[0].get("decoupled_weight_decay"):
        kind = "adamw"
    base = {**_hyperparameters(groups[0]), **getattr(type(optimizer), "legacy_hyperparameters", {})}
    param_groups: list[dict[str, Any]] = []
    if len(groups) > 1:
        names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
        index = 0
        for g in groups:
            hp = _hyperparameters(g)
            diff = {k: v for k, v in hp.items() if base.get(k) != v}
            if float(g["lr"]) != float(groups[0]["lr"]):
                diff["lr_factor"] = float(g["lr"]) / float(groups[0]["lr"]) if float(groups[0]["lr"]) else 0.0
            pnames = []
            for p in g["params"]:
                pnames.append(names.get(id(p), f"#{index}"))
                index += 1
            param_groups.append({"params": pnames, **diff})
        if all(len(g) == 1 for g in param_groups):
            param_groups = []
    return OptimizerSpec(type=kind, hyperparameters=base, param_groups=tuple(param_groups))


def learning_rate_from_torch(optimizer: torch.optim.Optimizer) -> float:
    """The constant learning rate of a torch optimizer (its first group's ``lr``)."""
    lr = optimizer.param_groups[0]["lr"]
    return float(lr.item() if isinstance(lr, torch.Tensor) else lr)


def optimizer_spec_from_params(section: Mapping[str, Any]) -> OptimizerSpec:
    """The :class:`OptimizerSpec` of the legacy params ``optimizer:`` section.

    ``optimizer_type`` is case-insensitive; the hyperparameters are
    :func:`csrun.program.optimizers.spec_hyperparameters` of the section (the type's own keys at
    their value or default, legacy keys under torch's names). Learning rate, loss scaling,
    clipping and accumulation are read by :func:`csrun.compiler.settings.settings_from_params`,
    not here. Unknown keys are errors.
    """
    unknown = sorted(set(section) - _PARAMS_KEYS)
    if unknown:
        raise ConfigError(f"unknown key(s) in params optimizer section: {', '.join(unknown)}",
                          fix="valid keys: " + ", ".join(sorted(_PARAMS_KEYS)))
    raw_type = section.get("optimizer_type")
    if not isinstance(raw_type, str):
        raise ConfigError(f"optimizer.optimizer_type must be a string, got {raw_type!r}",
                          fix="set optimizer_type to one of: " + ", ".join(table.NAMES))
    kind = raw_type.lower()
    if kind not in table.OPTIMIZERS:
        raise UnsupportedOptimizer(f"optimizer_type {raw_type!r} is not one the system has",
                                   fix="use one of: " + ", ".join(table.NAMES))
    try:
        hp = table.spec_hyperparameters(section)
    except ValueError as exc:
        raise ConfigError(f"optimizer: {exc}") from None
    return OptimizerSpec(type=kind, hyperparameters=hp)


def state_slots(spec: OptimizerSpec | None) -> float:
    """Parameter-sized state tensors the optimizer keeps per weight (for the memory budget).

    :func:`csrun.program.optimizers.state_slots`: e.g. sgd 1 with momentum else 0, the Adam
    family 2 (amsgrad +1), adafactor's factored second moments counted as 0.1 of a slot (an
    estimate). None (eval): 0.
    """
    if spec is None:
        return 0.0
    return table.state_slots(spec.type, spec.hyperparameters)
