"""What a streamer streams: an endless sequence of batches with epoch boundaries.

The user API wraps the user's DataLoader shard in a :class:`BatchSource`; the sender and the
lone-chief :class:`~csrun.stream.local.LocalStream` only see this protocol, so the protocol
never imports ``csrun.torch``.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol


class _EpochEnd:
    """The marker between epochs in a :meth:`BatchSource.stream`."""

    _instance: "_EpochEnd | None" = None

    def __new__(cls) -> "_EpochEnd":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "EPOCH_END"


EPOCH_END = _EpochEnd()
"""Yielded by :meth:`BatchSource.stream` after the last batch of each epoch."""


class BatchSource(Protocol):
    """A shard of the input, replayable epoch after epoch."""

    def batches_per_epoch(self) -> int | None:
        """Batches in one epoch of this shard, or None when unknown (iterable datasets)."""

    def stream(self, skip: int) -> Iterator[Any]:
        """Batches epoch after epoch, :data:`EPOCH_END` after each epoch, without end.

        ``skip`` batches of the sequence are left out first (cheaply where possible: a
        skipped epoch need not load its data). An epoch end at the skip point itself is not
        yielded. An epoch with no batches is an error (it would spin forever).
        """


class BatchStream(Protocol):
    """Where the chief's batches come from: the streamers' receiver, or the local loader."""

    def next(self) -> Any:
        """The next batch, or ``EPOCH_END``."""

    def stop(self) -> list[Any]:
        """Stop the stream; the streamers' statistics (none for a local stream)."""
