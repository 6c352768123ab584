"""``cbtorch.dataloader(loader)``: the user's DataLoader, sharded on streamers, streamed to the chief.

The same call runs on every task. It checks the loader against the system's rules and
builds this task's shard (see :mod:`csrun.torch.sharding`). Then:

* on a streamer, the shard is what :class:`~csrun.torch.session.Session` streams;
* on the chief with streamers, iterating yields the batches received from them, in the
  fixed round-robin order, one epoch per ``for`` loop (a loop left with ``break`` is
  continued by the next one); only inside a Session;
* on a compile-only run outside a Session (the R1.x zoo's compile runner opens none), the chief
  iterates its own shard, as a lone chief does, and a streamer waits as in a Session the chief
  never opens: the chief's exit releases it (exit 0);
* on a lone chief, iterating yields the local loader's batches, through the same checks
  and dtype rules as a stream, each copied into buffers the chief owns, as a streamed one is.

Each batch must be new tensors: a streamer sends a batch from its tensors while the next one
loads, so a pipeline that refills the tensors it handed over (a ``collate_fn`` writing into
preallocated ones) is refused at its next batch, on streamers and on a lone chief alike
(:func:`csrun.stream.refill.check_untouched`). torch's ``default_collate`` makes new ones.

``len()`` is the number of batches per epoch over all streamers (for an IterableDataset, which
shards itself, the count its own DataLoader gives here, if it has one); :meth:`StreamingDataLoader.skip`
starts the sequence at a global batch (exact resume). Every ``next()`` is a step boundary, which
the backend runs in one call (:meth:`csrun.torch.backend.Backend.next_step`: the previous step is
sent, the batch fetched, the previous step's closures run, the next step opened). The chief's time waiting for input and time in
steps are counted in :attr:`StreamingDataLoader.stats`.
"""

from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DataLoader

from csrun.errors import UserError
from csrun.stream.local import LocalStream
from csrun.stream.source import EPOCH_END, BatchStream
from csrun.stream.stats import ChiefStats, StreamerStats, TimedInput
from csrun.torch.closures import end_step
from csrun.torch.sharding import DataLoaderError, LoaderSource, plan_shard, shard_loader
from csrun.torch.process_state import state, stream_and_exit

DEFAULT_PREFETCH = 4
"""Batches in flight per streamer when the loader sets no ``prefetch_factor``."""


class StreamingDataLoader:
    """The wrapped loader ``cbtorch.dataloader()`` returns (see the module manual)."""

    def __init__(self, loader: DataLoader, *, prefetch: int | None = None) -> None:
        info = state().info
        num_shards = max(info.num_streamers, 1)
        shard = max(info.streaming_rank, 0)
        self.plan = plan_shard(loader, shard, num_shards)
        self.loader = loader
        """The user's loader, as given."""
        self.shard_loader, self._sampler = shard_loader(loader, self.plan)
        if prefetch is None:
            prefetch = getattr(loader, "prefetch_factor", None) or DEFAULT_PREFETCH
        if not isinstance(prefetch, int) or prefetch < 1:
            raise DataLoaderError(f"prefetch must be a positive number of batches, got {prefetch!r}")
        self.prefetch = prefetch
        """Batches in flight per streamer (the chief's receive ring)."""
        self.stats = ChiefStats()
        """The chief's input-wait and step times."""
        self._skip = 0
        self._taken = 0
        """Batches taken from the stream (a cluster's step takes several; an epoch's left-out ones count)."""
        self._stream: BatchStream | None = None
        self._input: TimedInput | None = None
        """The stream with the chief's clock (made at the first batch)."""
        self._in_step = False

    @property
    def dataset(self) -> Any:
        """The user's dataset."""
        return self.loader.dataset

    @property
    def batch_size(self) -> int | None:
        """Samples per batch (None: the dataset yields whole batches)."""
        return self.plan.batch_size

    def __len__(self) -> int:
        per_epoch = self.plan.batches_per_epoch
        if per_epoch is None:  # an IterableDataset shards itself: the count is its own, if it has one
            try:
                return len(self.loader)
            except TypeError:
                raise TypeError("this dataloader streams an IterableDataset that has no length") from None
        return per_epoch * self.plan.num_shards

    def skip(self, n: int) -> None:
        """Start the sequence at global batch ``n`` (0-based) instead of 0; call before the first batch."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise DataLoaderError(f"skip() needs a batch count >= 0, got {n!r}")
        if self._stream is not None:
            raise DataLoaderError("skip() must be called before the first batch is taken")
        self._skip = n

    def source(self) -> LoaderSource:
        """This task's shard as a stream source."""
        return LoaderSource(self.shard_loader, self._sampler, self.plan)

    def __iter__(self) -> Iterator[Any]:
        return _Epoch(self)

    # -- used by Session ------------------------------------------------------------------

    @property
    def data_position(self) -> int:
        """The stream's batch the next step starts at: :meth:`skip`'s plus every batch taken since
        (what a checkpoint records, and a resume skips to)."""
        return self._skip + self._taken

    @property
    def start_batch(self) -> int:
        """The global batch the sequence starts at (set by :meth:`skip`; 0 by default)."""
        return self._skip

    def attach(self, stream: BatchStream) -> None:
        """Take batches from ``stream`` (the Session's receiver) instead of the local loader."""
        self._stream, self._input = stream, None

    def finish(self, run_closures: bool = True) -> list[StreamerStats]:
        """End the step in flight (its closures run unless told not to), stop the stream.

        Returns the streamers' statistics.
        """
        st = state()
        stream, self._stream, self._input = self._stream, None, None
        try:
            if run_closures and (self._in_step or st.closures):
                self._in_step = False
                end_step()
        finally:  # a failing closure still stops the streamers
            self._in_step = False
            st.closures.clear()
            streamers = stream.stop() if stream is not None else []
        return streamers

    def _next(self) -> Any:
        st = state()
        if self._input is None:
            self._start_input(st)
        ended = None
        if self._in_step:  # the step that just ended: the backend sends it, fetches, then runs its closures
            self._in_step = False
            ended, st.closures = st.closures, []
        item = st.backend.next_step(self._take, ended)
        self._in_step = item is not EPOCH_END
        return item

    def _take(self) -> Any:
        """The stream's next batch (or EPOCH_END), counted in :attr:`data_position`."""
        assert self._input is not None  # noqa: S101 - _next started the input
        item = self._input.next()
        if item is not EPOCH_END:
            self._taken += 1
        return item

    def _start_input(self, st: Any) -> TimedInput:
        """The timed stream: the Session's receiver, or this task's shard on a lone chief."""
        if self._stream is None:
            if st.streaming and not st.options.path.compiles_only:
                raise UserError("iterate the dataloader inside `with cbtorch.Session(dataloader):` "
                                "(its batches come from the streamers)")
            if st.streaming and not st.info.is_chief:  # the chief compiles from its own shard
                stream_and_exit(self.source())  # released (STOP) when the chief exits
            self._stream = LocalStream(self.source(), skip=self._skip)
        self._input = TimedInput(self._stream, self.stats)
        return self._input


class _Epoch:
    """One ``for`` loop over the dataloader: up to the next epoch end."""

    def __init__(self, loader: StreamingDataLoader) -> None:
        self._loader = loader
        self._done = False

    def __iter__(self) -> "_Epoch":
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        item = self._loader._next()
        if item is EPOCH_END:
            self._done = True
            raise StopIteration
        return item


def dataloader(loader: DataLoader, *, prefetch: int | None = None) -> StreamingDataLoader:
    """Wrap ``loader`` for streaming: shard it on streamers, receive it on the chief.

    ``prefetch`` is the number of batches in flight per streamer (default: the loader's
    ``prefetch_factor``, else 4).
    """
    return StreamingDataLoader(loader, prefetch=prefetch)
