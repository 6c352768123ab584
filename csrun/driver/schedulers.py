"""torch LR schedulers on a wrapped optimizer: seen when created, run on the host as in eager PyTorch.

A script builds its scheduler before or after ``cbtorch.optimizer(opt)``; either way the
driver learns of it:

* **after wrapping**: csrun wraps ``LRScheduler.__init__`` and ``ReduceLROnPlateau.__init__``
  once per process (the originals run first, unchanged); a scheduler built on a wrapped
  optimizer is handed to that optimizer's watcher as soon as it exists;
* **before wrapping**: wrapping looks for schedulers already built on the optimizer (the
  objects that refer to it).

A torch scheduler runs on the host, unchanged: its ``step()`` writes each group's ``lr`` as in
eager PyTorch, and every update on the device takes the ``lr`` the script's group holds at
``optimizer.step()`` (:mod:`csrun.driver.coherence.hyperparameters`). So every scheduler torch
has (``LambdaLR``, ``OneCycleLR``, ``ReduceLROnPlateau`` on a metric read in a closure, Hugging
Face's ``get_*_schedule_with_warmup``, a schedule stepped per epoch) trains as it does eagerly.
The one thing refused is a torch scheduler beside a compiled schedule (a params
``learning_rate`` schedule, a cstorch scheduler): two owners of one learning rate.
"""

from __future__ import annotations

import functools
import gc
from typing import Any, Callable

import torch
from torch.optim import lr_scheduler as torch_sched

from csrun.compiler.errors import LRSchedulerNotSupported

_WATCH_ATTR = "_csrun_scheduler_watch"
"""The optimizer attribute holding what a new scheduler on it is handed to."""
_installed = False


class SchedulerWatch:
    """The torch schedulers of one wrapped optimizer (see the module manual)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.schedulers: list[Any] = []
        announce_schedulers(optimizer, self.add)

    def add(self, scheduler: Any) -> None:
        """A scheduler built on the optimizer."""
        if not any(s is scheduler for s in self.schedulers):
            self.schedulers.append(scheduler)

    def refuse_beside(self, schedule: Any) -> None:
        """Refuse the kept schedulers when the compile settings schedule the learning rate too."""
        if self.schedulers:
            names = ", ".join(sorted({type(s).__name__ for s in self.schedulers}))
            raise LRSchedulerNotSupported(
                f"a torch LR scheduler ({names}) and a learning_rate schedule in the compile settings "
                f"({schedule!r}) both set the learning rate",
                fix="give one of them: the torch scheduler (it runs on the host, as in eager PyTorch), or the schedule")


def announce_schedulers(optimizer: torch.optim.Optimizer, add: Callable[[Any], None]) -> None:
    """Call ``add(scheduler)`` for every torch LR scheduler built on ``optimizer``: those that
    exist now (the objects that refer to it) and, as each is built, the later ones."""
    _install()
    setattr(optimizer, _WATCH_ATTR, add)
    for obj in gc.get_referrers(optimizer):
        if isinstance(obj, (torch_sched.LRScheduler, torch_sched.ReduceLROnPlateau)) \
                and getattr(obj, "optimizer", None) is optimizer:
            add(obj)


def _install() -> None:
    """Wrap the schedulers' ``__init__`` once per process (see the module manual)."""
    global _installed
    if _installed:
        return
    for cls in (torch_sched.LRScheduler, torch_sched.ReduceLROnPlateau, torch_sched.SequentialLR,
                torch_sched.ChainedScheduler):  # the last three do not call LRScheduler.__init__
        cls.__init__ = _announcing(cls.__init__)  # type: ignore[method-assign]
    _installed = True


def _announcing(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        add = getattr(getattr(self, "optimizer", None), _WATCH_ATTR, None)
        if callable(add):
            add(self)

    return __init__
