"""The lone chief's stream: the local loader, with the same checks and dtypes as a real stream.

With no streamers the chief iterates its own :class:`~csrun.stream.source.BatchSource`.
Every batch still goes through the schema (static shapes and dtypes, int64 values that must
fit the wire's int32: :meth:`~csrun.stream.schema.Schema.copy_into`, what the chief would decode
from a streamer, without the bytes in between), so a CPU validation run refuses exactly what a
streamed run would, and the model sees the same dtypes. Each batch is copied into buffers this
stream owns (:mod:`csrun.stream.buffers`), as the wire would put it into the chief's receive
buffers: the device runs a step while the loop fetches the next batch, and a loader that refills
its tensors in place must not reach the step's inputs (nor a closure's arguments, which run after
that fetch). A refill by torch's in-place operations is refused as a streamer refuses it
(:func:`~csrun.stream.refill.check_untouched`); the copy covers the writes no version counter
sees (through a numpy view). Nothing is prefetched and MPI is never loaded.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterator

import torch

from csrun.stream.buffers import BufferPool
from csrun.stream.errors import BatchError
from csrun.stream.refill import REFILL_WATCH, check_untouched, sent_in_place
from csrun.stream.schema import Schema
from csrun.stream.source import EPOCH_END, BatchSource


class LocalStream:
    """Same ``next()`` contract as :class:`~csrun.stream.receiver.Receiver`, from a local source."""

    def __init__(self, source: BatchSource, *, skip: int = 0) -> None:
        self._source = source
        self._skip = skip
        self._items: Iterator[Any] | None = None
        self.schema: Schema | None = None
        self._pool: BufferPool | None = None
        self._handed: deque[list[tuple[str, torch.Tensor, int]]] = deque(maxlen=REFILL_WATCH)
        """The last batches' leaves a streamer would send in place, and their versions (check_untouched)."""
        self._epoch_batches = 0

    def start(self) -> None:
        """Begin the sequence at batch ``skip``."""
        self._items = self._source.stream(self._skip)

    def next(self) -> Any:
        """The next batch, or EPOCH_END at the end of each epoch."""
        if self._items is None:
            self.start()
        assert self._items is not None
        item = next(self._items)
        check_untouched(self._handed)
        if item is EPOCH_END:
            if self._epoch_batches == 0:
                raise BatchError("the input pipeline yielded no batch in an epoch: the dataset is "
                                 "smaller than one batch")
            self._epoch_batches = 0
            return EPOCH_END
        self._epoch_batches += 1
        schema, pool = self.schema, self._pool
        if schema is None or pool is None:
            schema = self.schema = Schema.infer(item)
            pool = self._pool = BufferPool(schema.local_buffers)
        tensors = schema.flatten(item)
        bufs = pool.take()
        batch = schema.copy_into(tensors, bufs.tensors)
        pool.lend(bufs)
        self._handed.append(sent_in_place(schema, tensors))
        return batch

    def stop(self) -> list:
        """Nothing to stop; no streamer statistics."""
        self._items = None
        return []
