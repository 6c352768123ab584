"""``cstorch.utils.data.compute_num_steps``: how many batches a loop runs, from the runconfig's keys.

``num_steps``: optimizer steps this run; ``max_steps``: the run ends at this global step (a
resumed run at ``initial_step`` has ``max_steps - initial_step`` left, and ``num_steps`` is cut
to that); ``num_epochs``: passes over the loader, ``steps_per_epoch`` each (default and upper
bound: the loader's length over ``grad_accum_steps``). ``num_steps`` and ``num_epochs``
exclude each other. The result counts batches: optimizer steps times ``grad_accum_steps``.
Nothing left to run (``initial_step >= max_steps``) and a loader without a length where one is
needed are :class:`~csrun.pytorch.utils.data.ExecutorError` lines.
"""

from __future__ import annotations

from typing import Any

from csrun.pytorch.utils.data.data_executor import ExecutorError


def _count(name: str, value: Any, minimum: int = 1) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ExecutorError(f"compute_num_steps({name}={value!r}): give an integer >= {minimum} or None")
    return value


def compute_num_steps(dataloader: Any, initial_step: int = 0, num_steps: int | None = None,
                      max_steps: int | None = None, num_epochs: int | None = None,
                      steps_per_epoch: int | None = None, grad_accum_steps: int = 1) -> int:
    """The batches the loop runs (see the module manual)."""
    initial = _count("initial_step", initial_step, 0) or 0
    num_steps, max_steps = _count("num_steps", num_steps), _count("max_steps", max_steps)
    num_epochs, steps_per_epoch = _count("num_epochs", num_epochs), _count("steps_per_epoch", steps_per_epoch)
    accum = _count("grad_accum_steps", grad_accum_steps) or 1
    if num_steps is not None and num_epochs is not None:
        raise ExecutorError("compute_num_steps: num_steps and num_epochs exclude each other; give one")
    if num_epochs is not None:
        try:
            per_epoch = len(dataloader) // accum
        except TypeError:
            raise ExecutorError("num_epochs needs a DataLoader with a length; give num_steps or max_steps") from None
        per_epoch = min(per_epoch, steps_per_epoch) if steps_per_epoch else per_epoch
        total: int | None = num_epochs * per_epoch
    else:
        total = num_steps
    if max_steps is not None:
        left = max_steps - initial
        if left <= 0:
            raise ExecutorError(f"the run starts at global step {initial}, which is already max_steps={max_steps}: "
                                f"nothing to train; raise max_steps or start from an earlier checkpoint")
        total = left if total is None else min(total, left)
    if total is None:
        raise ExecutorError("compute_num_steps: give num_steps, max_steps or num_epochs (runconfig)")
    if total < 1:
        raise ExecutorError(f"compute_num_steps: {total} steps to run; the loader has too few batches for an epoch")
    return total * accum


__all__ = ["compute_num_steps"]
