"""``cstorch.optim``: the optimizers the device runs, and the legacy ``configure_*`` helpers.

One class per optimizer type of :data:`csrun.program.optimizers.OPTIMIZERS` (the table is the
one list: the classes here are made from it), each a subclass of :class:`Optimizer` and of
the torch class it names (``torch.optim.SGD``, ``Adam``, ``AdamW``, ...; ``Lamb`` is the
engine's own, :class:`csrun.program.optimizer_classes.Lamb`). Building one hands it to the backend
(``cbtorch.optimizer``): on the device ``step()`` / ``zero_grad()`` become the step's order
checks and the device runs the update; on the CPU it is the torch optimizer.

:func:`configure_optimizer` builds one from the legacy ``optimizer_type`` and keys
(``beta1``/``beta2``, ``weight_decay_rate``, ``correct_bias``, ``exclude_from_weight_decay``...)
with the runner's own builder (:func:`csrun.program.optimizer_classes.build_optimizer`);
:func:`configure_lr_scheduler` builds a :class:`~csrun.pytorch.optim.lr_scheduler.LRScheduler`
from the legacy ``learning_rate`` forms (see :mod:`csrun.pytorch.optim.lr_scheduler`).

Public names: :class:`Optimizer`, one class per type (:data:`OPTIMIZER_CLASSES`),
:func:`configure_optimizer`, :func:`configure_lr_scheduler`, :mod:`lr_scheduler`.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch

import csrun.torch as cbtorch
from csrun.program import optimizer_classes as engine_optimizers
from csrun.errors import UserError
from csrun.program.errors import SpecError
from csrun.program.optimizers import OPTIMIZERS
from csrun.program.schedules import build_schedule
from csrun.program.optimizers import Optimizer as OptimizerEntry
from csrun.pytorch.backends import require_backend
from csrun.pytorch.optim import lr_scheduler
from csrun.pytorch.optim.lr_scheduler import LRScheduler


class OptimizerError(UserError):
    """An optimizer argument csrun cannot use."""


class Optimizer(torch.optim.Optimizer):
    """The base of cstorch's optimizers: a torch optimizer handed to the backend when built."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        prepare(self)


def prepare(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Hand ``optimizer`` to the backend (needs one: build the optimizer after ``cstorch.backend``)."""
    require_backend(f"building the optimizer {type(optimizer).__name__}")
    return cbtorch.optimizer(optimizer)


def _optimizer_class(entry: OptimizerEntry) -> type[Optimizer]:
    base = getattr(torch.optim if entry.in_torch else engine_optimizers, entry.class_name)
    where = f"torch.optim.{entry.class_name}" if entry.in_torch else "the engine's own"
    doc = (f"The ``{entry.name}`` optimizer ({where}), run by the backend: "
           f"``{entry.class_name}(params, lr=..., ...)`` with the torch class's arguments.")
    return type(entry.class_name, (Optimizer, base), {"__module__": __name__, "__doc__": doc})


OPTIMIZER_CLASSES: dict[str, type[Optimizer]] = {e.name: _optimizer_class(e) for e in OPTIMIZERS.values()}
"""Legacy ``optimizer_type`` -> its cstorch class (also a name of this module: ``optim.SGD``, ...)."""

globals().update({cls.__name__: cls for cls in OPTIMIZER_CLASSES.values()})


def __getattr__(name: str) -> type[Optimizer]:
    """Only for names that are not here (type checkers read the generated classes through it)."""
    names = ", ".join(cls.__name__ for cls in OPTIMIZER_CLASSES.values())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}; its optimizers: {names}")


def configure_optimizer(optimizer_type: str, params: Iterable[Any], **kwargs: Any) -> torch.optim.Optimizer:
    """The optimizer ``optimizer_type`` (any case) over ``params``, from legacy keys.

    ``params``: ``model.parameters()`` or ``model.named_parameters()`` (names are needed for
    ``exclude_from_weight_decay``). ``learning_rate`` (or ``lr``) must be a number: give a
    schedule to :func:`configure_lr_scheduler`. Other keys as the params YAML's optimizer
    section (``momentum``, ``beta1``, ``weight_decay_rate``, ``correct_bias``, ...).
    """
    require_backend("cstorch.optim.configure_optimizer")
    items = list(params)
    named = [(str(i), p) for i, p in enumerate(items)]
    if items and all(isinstance(x, tuple) and len(x) == 2 for x in items):
        named = [(str(n), p) for n, p in items]
    elif kwargs.get("exclude_from_weight_decay"):
        raise OptimizerError("configure_optimizer(exclude_from_weight_decay=...) matches parameter names: pass "
                             "params=model.named_parameters()")
    lr = kwargs.pop("learning_rate", kwargs.pop("lr", None))
    if isinstance(lr, (Mapping, list, tuple)):  # a schedule (2.2.1): its first rate until the scheduler is built
        lr = build_schedule(lr)(0)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)):
        raise OptimizerError(f"configure_optimizer(learning_rate={lr!r}): give a number or a schedule (a "
                             f"{{scheduler: ...}} mapping or a list of them)")
    opt = engine_optimizers.build_optimizer(optimizer_type, kwargs, named, lr=float(lr))
    return prepare(opt)


def configure_param_groups(model: torch.nn.Module, optimizer_params: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The parameters :func:`configure_optimizer` takes, by name (2.2.1's grouping: the optimizer keys
    ``exclude_from_weight_decay`` / ``weight_decay`` are applied there by name); per-layer
    ``adjust_learning_rate`` factors are refused (every group runs one schedule)."""
    if optimizer_params.get("adjust_learning_rate"):
        raise OptimizerError("optimizer.adjust_learning_rate: per-layer learning-rate factors are not supported; "
                             "give every parameter the same schedule")
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def configure_optimizer_params(optimizer_type: str, kwargs: Mapping[str, Any]) -> tuple[type, dict[str, Any]]:
    """Check ``optimizer_type`` and its keys as :func:`configure_optimizer` would; returns the class and the keys."""
    entry = OPTIMIZERS.get(str(optimizer_type).lower())
    if entry is None:
        raise OptimizerError(f"optimizer_type {optimizer_type!r}: not one csrun's device runs; give one of "
                             f"{', '.join(sorted(e.name for e in OPTIMIZERS.values()))}")
    params = dict(kwargs)
    params.update(params.pop("optim_params", None) or {})
    return OPTIMIZER_CLASSES[entry.name], params


def configure_scheduler_params(learning_rate: Any) -> tuple[str, dict[str, Any]]:
    """Check one ``learning_rate`` form (a ``{scheduler: ...}`` mapping or a number); returns its
    scheduler name and keys."""
    try:
        build_schedule(learning_rate)
    except SpecError as exc:
        raise OptimizerError(str(exc)) from None
    if isinstance(learning_rate, Mapping):
        rest = {k: v for k, v in learning_rate.items() if k != "scheduler"}
        return str(learning_rate.get("scheduler")), rest
    return "constant", {"learning_rate": learning_rate}


def configure_lr_scheduler(optimizer: torch.optim.Optimizer, learning_rate: Any,
                           adjust_learning_rate: Any = None) -> LRScheduler:
    """A scheduler running the legacy ``learning_rate`` (a number, a ``{scheduler: ...}`` mapping or a
    list of them, as the params YAML) on ``optimizer``."""
    if adjust_learning_rate:
        raise OptimizerError("configure_lr_scheduler(adjust_learning_rate=...): per-layer learning-rate factors "
                             "are not supported; give every param group the same schedule")
    return LRScheduler(optimizer, learning_rate)


__all__ = ["Optimizer", "OptimizerError", "OPTIMIZER_CLASSES", "configure_optimizer", "configure_lr_scheduler",
           "configure_param_groups", "configure_optimizer_params", "configure_scheduler_params",
           "lr_scheduler", "prepare", *(cls.__name__ for cls in OPTIMIZER_CLASSES.values())]
