"""Values a model call hands to host code from inside its forward: the step's extra outputs.

A 2.x model updates its eval metrics inside ``forward`` (``self.accuracy(labels=...,
predictions=...)``): the tensors it passes are made inside the model call, not returned by it.
On the device they exist only inside the step's program. So a caller that wants them (a
:mod:`csrun.pytorch.metrics` metric) *taps* them: :func:`tap` notes the function and its
arguments with the model call being recorded, the call's tensor arguments become outputs of
the program (after the model's own outputs, in call order), and when the call's results are
known (step 1's recording, and every later step's check, which does not run the forward) the
recorder hands the function and its arguments, now device values, to the ``queue`` the caller
gave (a step closure: it runs when the step's values are ready). Replaying the step
(``torch.export``, the first step's check against eager) collects the same taps, so the
program's outputs line up. Outside a device model call :func:`tap` returns False and the
caller does what it does on the CPU.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.utils._pytree as pytree

Queue = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], None]
"""What runs a tapped call once its values are known (the caller's step-closure queue)."""


@dataclass(frozen=True)
class Tap:
    """One tapped call: the function, its arguments' structure and their non-tensor leaves."""

    queue: Queue
    fn: Callable[..., Any]
    spec: pytree.TreeSpec
    leaves: tuple[Any, ...]
    """The arguments' leaves as given (tensors are replaced by the step's values when queued)."""

    @property
    def n_tensors(self) -> int:
        """How many of the arguments' leaves are tensors (the program's outputs for this tap)."""
        return sum(isinstance(leaf, torch.Tensor) for leaf in self.leaves)


_collectors: list[list[Tap]] = []


@contextlib.contextmanager
def collecting() -> Iterator[list[Tap]]:
    """Collect the taps of the model call run inside (nested calls collect their own)."""
    found: list[Tap] = []
    _collectors.append(found)
    try:
        yield found
    finally:
        _collectors.pop()


def tap(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], queue: Queue) -> bool:
    """Note ``fn(*args, **kwargs)`` with the model call being recorded; False outside one."""
    if not _collectors:
        return False
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    _collectors[-1].append(Tap(queue=queue, fn=fn, spec=spec, leaves=tuple(leaves)))
    return True


def tensors(found: list[Tap] | tuple[Tap, ...]) -> list[torch.Tensor]:
    """The tapped tensors, in call order (the program's extra outputs)."""
    return [leaf for t in found for leaf in t.leaves if isinstance(leaf, torch.Tensor)]


def with_taps(out: Any, found: list[Tap] | tuple[Tap, ...]) -> Any:
    """A model call's result with its tapped tensors after it (``out`` itself when none were tapped)."""
    return (out, tensors(found)) if found else out


def queue_all(found: tuple[Tap, ...], values: list[Any]) -> None:
    """Hand each tap's function its arguments with ``values`` (the step's values of the tapped tensors)."""
    it = iter(values)
    for t in found:
        leaves = [next(it) if isinstance(leaf, torch.Tensor) else leaf for leaf in t.leaves]
        args, kwargs = pytree.tree_unflatten(leaves, t.spec)
        t.queue(t.fn, args, kwargs)


__all__ = ["Tap", "Queue", "collecting", "tap", "tensors", "with_taps", "queue_all"]
