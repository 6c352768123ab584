"""Batch buffers the chief owns, lends to the training loop and takes back once the batch is gone.

A batch the chief hands out lives in memory the chief owns, never in the input pipeline's: the
receive buffers a streamer's batch lands in (:mod:`csrun.stream.receiver`), or, for the lone
chief (:mod:`csrun.stream.local`), buffers its batch is copied into, as the wire would. The
device runs a step while the loop fetches the next batch and the step's closures run after that
fetch, so a loader that refills one buffer in place (a ``collate_fn`` writing into preallocated
tensors) must not be able to reach a batch in use.

:class:`BufferPool` reuses a :class:`BufferSet` only once nothing outside it references its
memory any more (torch's storage use count: the batch, the device's copy of its inputs, a
closure's argument all hold views); otherwise it allocates a fresh set and leaves the old one
to its user. It checks the last :data:`LENT_TRACKED` sets lent; an older one is left to its user.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import numpy as np
import torch

_use_count = getattr(torch._C, "_storage_Use_Count", None)

LENT_TRACKED = 16
"""Buffer sets lent to the user that the pool keeps checking for reuse (the oldest dropped past it)."""


def _uses(t: torch.Tensor) -> int:
    return int(_use_count(t.untyped_storage()._cdata)) if _use_count else -1


class BufferSet:
    """The buffers of one batch (one tensor per leaf), and their storages' use counts when unlent."""

    def __init__(self, tensors: list[torch.Tensor], *, arrays: bool = False) -> None:
        """``arrays``: keep numpy views of the tensors too (MPI's receive buffers). They are made
        before the use counts are taken, since a numpy view counts as a use of its storage."""
        self.tensors = tensors
        self.arrays: list[np.ndarray] = [t.numpy() for t in tensors] if arrays else []
        self.baseline = [_uses(t) for t in tensors]

    def free(self) -> bool:
        """True when nothing outside this set references its memory any more."""
        return _use_count is not None and [_uses(t) for t in self.tensors] == self.baseline


class BufferPool:
    """Buffer sets lent to the user, reclaimed once the user drops the batch; ``make`` allocates a
    set (``arrays``: see :class:`BufferSet`)."""

    def __init__(self, make: Callable[[], list[torch.Tensor]], track: int = LENT_TRACKED, *,
                 arrays: bool = False) -> None:
        self._make, self._track, self._arrays = make, track, arrays
        self._lent: deque[BufferSet] = deque()

    def take(self) -> BufferSet:
        """A set no batch uses any more (the oldest such), else a new one."""
        for i, bufs in enumerate(self._lent):
            if bufs.free():
                del self._lent[i]
                return bufs
        return BufferSet(self._make(), arrays=self._arrays)

    def lend(self, bufs: BufferSet) -> None:
        """``bufs`` now holds a batch handed out; checked for reuse from now on."""
        self._lent.append(bufs)
        while len(self._lent) > self._track:
            self._lent.popleft()  # the user keeps it; we stop tracking it
