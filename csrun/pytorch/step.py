"""``@cstorch.trace`` / ``@cstorch.compile_step``, ``@cstorch.step_closure``, ``@cstorch.checkpoint_closure``.

A traced step is the function a 2.x loop calls once per batch of a
:class:`~csrun.pytorch.utils.data.DataExecutor`: zero_grad, the model call(s), the loss,
backward (or ``cstorch.amp.optimizer_step``), ``optimizer.step()``. On the device it is the
driver's whole-step capture (:mod:`csrun.driver.step_recording`): recorded on the first batch,
compiled at that step's end, run by the device from then on and checked against the
recording on later steps; what it returns are device values, read in step closures. On the
CPU it runs eagerly. Either way it must run inside the executor's loop, once per batch; an
argument that is the executor's own ``DataLoader`` stands for the current batch (the slides'
skeleton calls ``training_step(dataloader)``).

On a CPU backend with mixed precision the step runs under bfloat16 autocast (2.2.1's CPU
backend; :mod:`csrun.pytorch.backends`).

``@step_closure`` is cbtorch's (:func:`csrun.torch.step_closure`): calling the function queues
it, with its arguments, to run when the step's values are ready. ``@checkpoint_closure``
queues it the same way but only on the executor's checkpoint steps
(:attr:`~csrun.pytorch.utils.data.DataExecutor.on_checkpoint_step`); on other steps the call
does nothing. Called outside an executor's loop (2.2.1's ``save_initial_checkpoint``, before
the loop) it runs at once.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from csrun.pytorch.amp import autocast
from csrun.torch import add_step_closure, step_closure
from csrun.pytorch.utils.data import DataExecutor, ExecutorError, current_executor

F = TypeVar("F", bound=Callable[..., Any])


def _executor(fn: Callable[..., Any], what: str) -> DataExecutor:
    """The running executor, or the error saying ``fn`` (``what``) runs inside its loop."""
    executor = current_executor()
    if executor is None:
        raise ExecutorError(f"{getattr(fn, '__name__', what)}() runs inside `for batch in executor:` (a "
                            f"cstorch.utils.data.DataExecutor){'' if what == 'the step' else ': ' + what}")
    return executor


def trace(fn: F) -> F:
    """Decorator: ``fn`` is the training (or eval) step, run once per batch of the executor's loop."""
    if not callable(fn):
        raise ExecutorError(f"cstorch.trace decorates the step function, got {type(fn).__name__}")

    @functools.wraps(fn)
    def step(*args: Any, **kwargs: Any) -> Any:
        executor = _executor(fn, "the step")
        batch = executor.begin_traced_step()
        source = executor.dataloader
        args = tuple(batch if a is source else a for a in args)
        kwargs = {k: batch if v is source else v for k, v in kwargs.items()}
        with autocast():
            return fn(*args, **kwargs)

    return step  # type: ignore[return-value]


compile_step = trace
"""The 2.x alias of :func:`trace`."""


def checkpoint_closure(fn: F) -> F:
    """Decorator: calling the function queues it as a step closure on checkpoint steps only."""
    if not callable(fn):
        raise ExecutorError(f"cstorch.checkpoint_closure decorates a function, got {type(fn).__name__}")

    @functools.wraps(fn)
    def queue(*args: Any, **kwargs: Any) -> None:
        executor = current_executor()
        if executor is None:
            fn(*args, **kwargs)
        elif executor.on_checkpoint_step:
            add_step_closure(fn, args, kwargs)

    return queue  # type: ignore[return-value]


__all__ = ["trace", "compile_step", "step_closure", "checkpoint_closure"]
