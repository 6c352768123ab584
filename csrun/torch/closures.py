"""Step closures: code that runs when the device has produced a step's values.

``add_step_closure(fn, args=(), run_async=False)`` queues ``fn(*args)`` to run at the end
of the current step; ``@step_closure`` turns a function into one that queues itself when
called. The step boundary is the chief's dataloader being asked for its next batch, the end
of the loop, or the end of the session; closures of one step run in the order they were
added, after the step has been sent to the device and the next batch fetched (so the input
work overlaps the device's step, as the system's streamers ran ahead), and before the next
step begins: a closure sees the state after its own step. On the CPU they run inline; on a device the
backend first turns device tensors in ``args`` into CPU tensors (reading a device tensor
anywhere else is an error on the system). On the CPU outside a Session there is no step to end
(a loop over the user's own DataLoader, as the R1.x zoo's CPU runner has): a closure runs at
once, as the system ran it off the device.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from csrun.driver.closures import StepClosure
from csrun.errors import UserError
from csrun.torch.backend import EagerBackend
from csrun.torch.process_state import state

F = TypeVar("F", bound=Callable[..., Any])


def add_step_closure(fn: Callable[..., Any], args: tuple = (), kwargs: dict[str, Any] | None = None,
                     run_async: bool = False) -> None:
    """Run ``fn(*args, **kwargs)`` at the end of the current step, after the closures added before it
    (the legacy ``cm.add_step_closure(fn, args=(), kwargs={}, run_async=False)``)."""
    if not callable(fn):
        raise UserError(f"add_step_closure needs a callable, got {type(fn).__name__} {fn!r}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise UserError(f"add_step_closure: kwargs must be a dict, got {type(kwargs).__name__}")
    _queue(StepClosure(fn=fn, args=tuple(args), kwargs=dict(kwargs or {}), run_async=run_async))


def step_closure(fn: F) -> F:
    """Decorator: calling the function queues it as a step closure with the call's arguments."""

    @functools.wraps(fn)
    def queue(*args: Any, **kwargs: Any) -> None:
        _queue(StepClosure(fn=fn, args=args, kwargs=kwargs))

    return queue  # type: ignore[return-value]


def _queue(closure: StepClosure) -> None:
    """Queue ``closure`` for the step's end; on the CPU outside a Session, run it now."""
    st = state()
    if st.session is None and isinstance(st.backend, EagerBackend) and not st.closures:
        closure()
        return
    st.closures.append(closure)


def end_step() -> None:
    """Hand the queued closures to the backend (the step boundary)."""
    st = state()
    closures, st.closures = st.closures, []
    st.backend.end_step(closures)
