"""The lone chief's stream: the local loader, with the same checks and dtypes as a real stream.

With no streamers the chief iterates its own :class:`~csrun.stream.source.BatchSource`.
Every batch still goes through the schema (static shapes and dtypes, int64 values that must
fit the wire's int32: :meth:`~csrun.stream.schema.Schema.as_streamed`, what the chief would
decode from a streamer, without the bytes in between), so a CPU validation run refuses exactly
what a streamed run would, and the model sees the same dtypes. Nothing is prefetched and MPI is
never loaded.
"""

from __future__ import annotations

from typing import Any, Iterator


from csrun.stream.errors import BatchError
from csrun.stream.schema import Schema
from csrun.stream.source import EPOCH_END, BatchSource


class LocalStream:
    """Same ``next()`` contract as :class:`~csrun.stream.receiver.Receiver`, from a local source."""

    def __init__(self, source: BatchSource, *, skip: int = 0) -> None:
        self._source = source
        self._skip = skip
        self._items: Iterator[Any] | None = None
        self.schema: Schema | None = None
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
        if item is EPOCH_END:
            if self._epoch_batches == 0:
                raise BatchError("the input pipeline yielded no batch in an epoch: the dataset is "
                                 "smaller than one batch")
            self._epoch_batches = 0
            return EPOCH_END
        self._epoch_batches += 1
        if self.schema is None:
            self.schema = Schema.infer(item)
        return self.schema.as_streamed(item)

    def stop(self) -> list:
        """Nothing to stop; no streamer statistics."""
        self._items = None
        return []
