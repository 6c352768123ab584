"""Autograd the script drives itself inside a step: honoured where the device's one backward computes
the same, refused at the line where it does not.

The device runs one backward per step, autograd's own, through the program it captured from
the forward. Three things a script may do inside the step change that:

* **a custom** ``torch.autograd.Function`` **with its own backward** (a straight-through
  estimator, a clipped gradient): the capture records its forward only, so the device would
  differentiate that instead of running the script's backward. Refused at the ``apply`` line
  (:class:`CustomBackward`), naming the class.
* **reentrant activation checkpointing** (``torch.utils.checkpoint.checkpoint(...,
  use_reentrant=True)``): its backward recomputes the same forward and differentiates it, the
  gradients autograd gives the plain call. The device runs it as the non-reentrant form (which
  the capture holds), so it trains as eager does; when no input of the block needs a gradient,
  reentrant checkpointing lets none flow into it, and neither does the device.
* ``torch.autograd.grad`` **inside the forward** (a gradient penalty, ``create_graph=True``):
  a second differentiation the one backward does not hold. Refused at its line
  (:class:`NestedGradient`); on the step's values outside the forward the recorder refuses it
  the same way.

:func:`on_the_device` applies this while the user's forward runs on the host for the step
(its recording, the compile's trace, the check's replay).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch
import torch.utils.checkpoint as checkpointing

from csrun.compiler.errors import at
from csrun.compiler.locate import caller_location, definition_location
from csrun.errors import UserError


class CustomBackward(UserError):
    """A ``torch.autograd.Function`` with its own backward in the step."""


class NestedGradient(UserError):
    """``torch.autograd.grad`` inside the step (a second differentiation)."""


NESTED_FIX = ("the device runs one backward per step, from the loss; compute the penalty without a second "
              "differentiation (e.g. a finite difference), or train this model on the CPU path (csrun_cpu)")

_STATE = threading.local()
_ORIGINAL_APPLY = torch.autograd.Function.apply.__func__  # type: ignore[attr-defined]
ORIGINAL_GRAD = torch.autograd.grad
"""torch's ``autograd.grad`` (the recorder refuses it on step values)."""
_lock = threading.Lock()
_depth = 0


def _apply(cls: type, *args: Any, **kwargs: Any) -> Any:
    if getattr(_STATE, "active", 0) and threading.get_ident() == getattr(_STATE, "thread", None):
        if cls is checkpointing.CheckpointFunction:
            function, preserve, *inputs = args
            if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
                return checkpointing.checkpoint(function, *inputs, use_reentrant=False, preserve_rng_state=preserve)
            with torch.no_grad():  # reentrant: no input needs a gradient, so none flows through (eager's warning case)
                return function(*inputs)
        if not cls.__module__.startswith("torch."):
            defined = definition_location(cls)
            where = f" (defined at {defined.filename}:{defined.lineno})" if defined is not None else ""
            raise CustomBackward(
                f"{at(caller_location())}{cls.__qualname__}{where} is a torch.autograd.Function with its own "
                "backward: the device differentiates the step's forward itself and would not run it; write its "
                "effect with tensor operations (a straight-through estimator: x + (f(x) - x).detach()), or train "
                "this model on the CPU path (csrun_cpu)")
    return _ORIGINAL_APPLY(cls, *args, **kwargs)


def _grad(*args: Any, **kwargs: Any) -> Any:
    if getattr(_STATE, "active", 0) and threading.get_ident() == getattr(_STATE, "thread", None):
        raise NestedGradient(f"{at(caller_location())}torch.autograd.grad inside the model's forward: {NESTED_FIX}")
    return ORIGINAL_GRAD(*args, **kwargs)


@contextlib.contextmanager
def on_the_device() -> Iterator[None]:
    """While the user's forward runs on this thread for the step (see the module manual)."""
    global _depth
    with _lock:
        if _depth == 0:
            torch.autograd.Function.apply = classmethod(_apply)  # type: ignore[assignment, method-assign]
            torch.autograd.grad = _grad  # type: ignore[assignment]
        _depth += 1
    outer = getattr(_STATE, "active", 0)
    _STATE.active, _STATE.thread = outer + 1, threading.get_ident()
    try:
        yield
    finally:
        _STATE.active = outer
        with _lock:
            _depth -= 1
            if _depth == 0:
                torch.autograd.Function.apply = classmethod(_ORIGINAL_APPLY)  # type: ignore[assignment, method-assign]
                torch.autograd.grad = ORIGINAL_GRAD
