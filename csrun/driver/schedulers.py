"""torch LR schedulers on a wrapped optimizer: seen when created, refused when the device cannot run them.

A script builds its scheduler before or after ``cbtorch.optimizer(opt)``; either way the
driver learns of it:

* **after wrapping**: csrun wraps ``LRScheduler.__init__`` and ``ReduceLROnPlateau.__init__``
  once per process (the originals run first, unchanged); a scheduler built on a wrapped
  optimizer is handed to that optimizer's watcher as soon as it exists;
* **before wrapping**: wrapping looks for schedulers already built on the optimizer (the
  objects that refer to it).

The watcher refuses a scheduler the device cannot run right there, with
:class:`~csrun.compiler.errors.LRSchedulerNotSupported` and the fix (see
:mod:`csrun.compiler.lr_schedulers`), and makes each kept scheduler's ``step()`` an order check
(after ``optimizer.step()``, as torch wants) that also runs torch's own step, so the CPU copy's
``get_last_lr()`` follows the device's schedule. The schedule itself is compiled from the
scheduler (:func:`csrun.compiler.lr_schedulers.learning_rate_of`): the device computes the
learning rate from the global step.
"""

from __future__ import annotations

import functools
import gc
from typing import Any, Callable

import torch
from torch.optim import lr_scheduler as torch_sched

from csrun.compiler.errors import LRSchedulerNotSupported
from csrun.compiler.lr_schedulers import check_scheduler, learning_rates_of

_WATCH_ATTR = "_csrun_scheduler_watch"
"""The optimizer attribute holding what a new scheduler on it is handed to."""
_OWN_STEP = "_csrun_own_step"
_installed = False
_constructing = 0
"""Depth of scheduler constructors running: their own calls of ``step()`` are not the loop's."""


class SchedulerWatch:
    """The schedulers of one wrapped optimizer (see the module manual)."""

    def __init__(self, optimizer: torch.optim.Optimizer, on_step: Callable[[], None]) -> None:
        """``on_step``: the order check a scheduler's ``step()`` runs first."""
        self.optimizer = optimizer
        self.schedulers: list[Any] = []
        self._on_step = on_step
        announce_schedulers(optimizer, self.add)

    def add(self, scheduler: Any) -> None:
        """A scheduler built on the optimizer: refused now, or kept with an order-checked ``step()``."""
        if any(s is scheduler for s in self.schedulers):
            return
        check_scheduler(scheduler)
        for child in getattr(scheduler, "_schedulers", ()):  # the composite's step() steps them
            own = child.__dict__.pop(_OWN_STEP, None)
            if own is not None:
                child.step = own
        own_step = scheduler.step
        on_step = self._on_step

        @functools.wraps(own_step)
        def step(*args: Any, **kwargs: Any) -> Any:
            if not _constructing:
                on_step()
            return own_step(*args, **kwargs)

        scheduler.__dict__[_OWN_STEP] = own_step
        scheduler.step = step
        self.schedulers.append(scheduler)

    def top_level(self) -> list[Any]:
        """The kept schedulers that are not children of a SequentialLR / ChainedScheduler."""
        children = {id(c) for s in self.schedulers for c in getattr(s, "_schedulers", ())}
        return [s for s in self.schedulers if id(s) not in children]

    def learning_rates(self) -> list[Any] | None:
        """The legacy ``learning_rate`` the kept schedulers amount to, one per param group (None
        when there are none)."""
        top = self.top_level()
        if not top:
            return None
        if len(top) > 1:
            names = ", ".join(type(s).__name__ for s in top)
            raise LRSchedulerNotSupported(f"{len(top)} schedulers step one optimizer ({names})",
                                          fix="combine them with ChainedScheduler([...]) or SequentialLR([...], milestones)")
        return learning_rates_of(top[0])


def announce_schedulers(optimizer: torch.optim.Optimizer, add: Callable[[Any], None]) -> None:
    """Call ``add(scheduler)`` for every torch LR scheduler built on ``optimizer``: those that
    exist now (the objects that refer to it) and, as each is built, the later ones."""
    _install()
    setattr(optimizer, _WATCH_ATTR, add)
    for obj in gc.get_referrers(optimizer):
        if isinstance(obj, torch_sched.LRScheduler) and getattr(obj, "optimizer", None) is optimizer:
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
        global _constructing
        _constructing += 1
        try:
            init(self, *args, **kwargs)
        finally:
            _constructing -= 1
        add = getattr(getattr(self, "optimizer", None), _WATCH_ATTR, None)
        if callable(add):
            add(self)

    return __init__
