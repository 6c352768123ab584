"""Step closures: :class:`StepClosure`, and on the device their handles resolved to CPU tensors, in order.

At each step boundary the chief hands the step's closures to :class:`ClosureRunner.run`:

* step values (:class:`~csrun.driver.step_values.StepValue`), device tensors and step
  handles anywhere in a closure's ``args``/``kwargs`` (inside tuples, lists and dicts too) are
  replaced by their CPU values, waiting for the step they belong to; step values the closure
  reaches otherwise (captured variables, a dataclass output) read their values while it runs;
* plain closures then run at once on the chief, in the order added;
* ``run_async=True`` closures run on one background thread, in the order added (resolving
  there too, so the chief does not wait for the device). They overlap the next step only:
  the next boundary waits for them, and an exception one raised is re-raised on the chief
  there (or at the session's end).

A step that has no closures does not wait for the device: the chief runs ahead, up to the
device's ``queue_depth`` steps.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from torch.utils import _pytree as pytree

from csrun.driver.step_values import StepValue, in_closure, value_of
from csrun.emulator.handles import DeviceTensor, StepHandle


@dataclass(kw_only=True)
class StepClosure:
    """A function to run at the end of the step it was added in."""

    fn: Callable[..., Any]
    """What to call."""
    args: tuple = ()
    """Positional arguments (device-tensor handles are resolved before the call)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments."""
    run_async: bool = False
    """The device may run it on a helper thread, still in order; the CPU backend runs it inline."""

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


def resolve(obj: Any) -> Any:
    """``obj`` with every device tensor / step handle replaced by its CPU value."""

    def one(x: Any) -> Any:
        if isinstance(x, StepValue):
            return value_of(x)
        if isinstance(x, DeviceTensor):
            return x.resolve()
        if isinstance(x, StepHandle):
            return x.result()
        return x

    return pytree.tree_map(one, obj)


def call(closure: StepClosure) -> Any:
    """Resolve the closure's arguments and call it (step values it captured read their values too)."""
    args, kwargs = resolve((tuple(closure.args), dict(closure.kwargs)))
    with in_closure():
        return closure.fn(*args, **kwargs)


class ClosureRunner:
    """Runs each step's closures (see the module manual)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []

    def run(self, closures: list[StepClosure]) -> None:
        """The step boundary: settle the previous step's async closures, then run this step's."""
        self.settle()
        for closure in closures:
            if closure.run_async:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cs-step-closure")
                self._pending.append(self._pool.submit(call, closure))
            else:
                call(closure)

    def settle(self) -> None:
        """Wait for the async closures queued so far; re-raise the first exception one raised."""
        pending, self._pending = self._pending, []
        first: BaseException | None = None
        for fut in pending:
            exc = fut.exception()
            if exc is not None and first is None:
                first = exc
        if first is not None:
            raise first

    def close(self) -> None:
        """Stop the background thread (after the closures queued so far)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
