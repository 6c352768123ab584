"""The lone chief's stream: its own copies of each batch, and the refill check a streamer makes."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest
import torch

from csrun.stream.errors import BatchError
from csrun.stream.local import LocalStream
from csrun.stream.source import EPOCH_END

pytestmark = pytest.mark.timeout(30)


class _Source:
    """``make(i)`` for batch i, four batches an epoch."""

    def __init__(self, make: Callable[[int], Any]) -> None:
        self.make = make

    def batches_per_epoch(self) -> int:
        return 4

    def stream(self, skip: int) -> Iterator[Any]:
        i = skip
        while True:
            yield self.make(i)
            i += 1
            if i % 4 == 0:
                yield EPOCH_END


def _take(stream: LocalStream, n: int) -> list[Any]:
    out = []
    while len(out) < n:
        item = stream.next()
        if item is not EPOCH_END:
            out.append(item)
    return out


def test_a_pipeline_alternating_between_two_buffers_is_refused_at_its_third_batch() -> None:
    rings = [torch.zeros(2, 3), torch.zeros(2, 3)]

    def make(i: int) -> torch.Tensor:
        rings[i % 2].fill_(float(i))
        return rings[i % 2]

    stream = LocalStream(_Source(make))
    _take(stream, 2)
    with pytest.raises(BatchError, match=r"wrote into the tensor at <batch> of a batch it had already handed over"):
        _take(stream, 1)


def test_slices_of_one_ring_detached_are_not_refills() -> None:
    """Each batch a different, never rewritten part of one tensor: its version counter moves with
    every write to the ring, but no batch handed over is written."""
    ring = torch.zeros(8, 3)

    def make(i: int) -> torch.Tensor:
        ring[i % 8].fill_(float(i))
        return ring[i % 8].detach()

    got = _take(LocalStream(_Source(make)), 6)
    assert [float(b[0]) for b in got] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_batches_first_taken_in_inference_mode_are_refilled_outside_it() -> None:
    """An eval pass in inference mode first, training after: the chief's buffers are never
    inference tensors, so refilling them outside inference mode works."""
    stream = LocalStream(_Source(lambda i: (torch.full((2, 3), float(i)), torch.tensor([i, i]))))
    with torch.inference_mode():
        first = _take(stream, 2)
    assert [float(b[0][0, 0]) for b in first] == [0.0, 1.0]
    del first
    later = _take(stream, 6)
    assert [int(b[1][0]) for b in later] == [2, 3, 4, 5, 6, 7]
    assert not any(t.is_inference() for b in later for t in b)
