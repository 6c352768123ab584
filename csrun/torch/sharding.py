"""Sharding a DataLoader across streamers, and the refusals the system made.

Streamer ``k`` of ``S`` takes the samples at positions ``k, k+S, k+2S, ...`` of the loader's
sampler order (the legacy sampler's rule), batched exactly as the user's loader batches
them. A lone chief is shard 0 of 1. Refused, with a message naming the value:

* ``drop_last=False`` ("drop_last must be set to True"): the system needs every batch to
  have the same, static size;
* a dataset whose sample count cannot be split evenly across the streamers;
* a shard smaller than one batch;
* a loader with no automatic batching (``batch_size=None``) over a map-style dataset. An
  IterableDataset under ``batch_size=None`` yields whole batches itself (the R1.x zoo's BERT
  input does): each item is a batch, of the schema's static shapes.

A custom ``batch_sampler`` (any class but torch's ``BatchSampler``; the 2.x zoo's ``CBSampler``)
shards itself, as the system's input workers expected: it is streamed as it is, its batches
are this task's, and its length (when it has one) is this task's batches per epoch. Its
batches must have one static size, as every batch streamed must (the stream's schema check).

A loader the script already shards (a ``DistributedSampler`` over ``num_streamers()`` at this
task's ``get_streaming_rank()``, as the R1.x zoo's input functions build one) is streamed as it
is: it is this task's shard, and the system did not shard it again. A ``DistributedSampler`` over
another number of replicas or at another rank, or one that would pad its shard with repeated
samples, is refused in one line.

Iterable-style datasets are not sharded here: they shard themselves, using
``cbtorch.task_id()`` and ``cbtorch.num_tasks()`` (the streaming rank and the number of
streamers), as the legacy HDF5 readers did. Shuffled loaders must draw the same order on
every task: seed torch identically everywhere (the runner does) or give the loader a
seeded ``generator``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sized, cast

from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, Sampler

from csrun.errors import UserError
from csrun.stream.source import EPOCH_END


class DataLoaderError(UserError):
    """A DataLoader the system could not stream (the message names the value and the fix)."""


@dataclass(frozen=True, kw_only=True)
class ShardPlan:
    """How one task's shard of a loader looks."""

    shard: int
    """This task's shard index (its streaming rank; 0 on a lone chief)."""
    num_shards: int
    """Number of shards (streamers; 1 on a lone chief)."""
    batch_size: int | None
    """Samples per batch (None: an IterableDataset under ``batch_size=None`` yields whole batches)."""
    iterable: bool
    """True for an IterableDataset (the dataset shards itself)."""
    num_samples: int | None
    """Samples in one epoch of the whole loader, when known."""
    presharded: bool = False
    """The script's loader is already this task's shard (a ``DistributedSampler``): streamed as it is."""
    self_sharding: bool = False
    """A custom ``batch_sampler`` picks this task's batches itself: the loader is streamed unchanged."""

    @property
    def batches_per_epoch(self) -> int | None:
        """Batches per epoch in one shard, when known."""
        if self.num_samples is None or self.batch_size is None:
            return None
        return self.num_samples // self.num_shards // self.batch_size


def plan_shard(loader: Any, shard: int, num_shards: int) -> ShardPlan:
    """Check ``loader`` against the system's rules and describe shard ``shard`` of ``num_shards``."""
    if not isinstance(loader, DataLoader):
        raise DataLoaderError(f"cbtorch.dataloader() needs a torch.utils.data.DataLoader, got "
                              f"{type(loader).__name__}")
    iterable = isinstance(loader.dataset, IterableDataset)
    batch_sampler = loader.batch_sampler
    if iterable and loader.batch_size is None and batch_sampler is None:  # its items are the batches
        return ShardPlan(shard=shard, num_shards=num_shards, batch_size=None, iterable=True, num_samples=None)
    if loader.batch_size is None and batch_sampler is None:
        raise DataLoaderError("the DataLoader has batch_size=None (no automatic batching): set a "
                              "batch_size; the system streams fixed-size batches")
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:  # it shards itself
        return ShardPlan(shard=shard, num_shards=num_shards, batch_size=None, iterable=iterable,
                         num_samples=None, self_sharding=True)
    if loader.batch_size is not None:
        batch_size, drop_last = loader.batch_size, loader.drop_last
    else:
        batch_sampler = cast(BatchSampler, batch_sampler)  # checked above: a plain BatchSampler
        batch_size, drop_last = batch_sampler.batch_size, batch_sampler.drop_last
    if not drop_last:
        raise DataLoaderError(f"drop_last must be set to True (got drop_last={drop_last!r}): the "
                              "system needs every batch to have the same size")
    num_samples = None
    presharded = False
    if not iterable:
        sampler = loader.sampler if batch_sampler is None else batch_sampler.sampler
        num_samples = len(cast(Sized, sampler))
        if isinstance(sampler, DistributedSampler):
            _check_presharded(sampler, shard, num_shards)
            presharded, num_samples = True, num_samples * num_shards
        if num_samples % num_shards:
            raise DataLoaderError(
                f"the dataset's {num_samples} samples cannot be split evenly across {num_shards} "
                f"streamers ({num_samples} % {num_shards} = {num_samples % num_shards}): use a "
                f"sample count divisible by {num_shards} (e.g. a Subset of "
                f"{num_samples - num_samples % num_shards}) or another number of streamers")
        per_shard = num_samples // num_shards
        if per_shard < batch_size:
            where = (f"streamer {shard}'s shard holds {per_shard} samples ({num_samples} samples "
                     f"over {num_shards} streamers)" if num_shards > 1
                     else f"the dataset holds {per_shard} samples")
            raise DataLoaderError(f"{where}, fewer than one batch of {batch_size}: use a smaller "
                                  "batch_size, more data or fewer streamers")
    return ShardPlan(shard=shard, num_shards=num_shards, batch_size=batch_size, iterable=iterable,
                     num_samples=num_samples, presharded=presharded)


def _check_presharded(sampler: DistributedSampler, shard: int, num_shards: int) -> None:
    """:class:`DataLoaderError` unless ``sampler`` is exactly this task's shard, without repeats."""
    replicas, rank = sampler.num_replicas, sampler.rank
    if (replicas, rank) != (num_shards, shard):
        raise DataLoaderError(
            f"the DataLoader's DistributedSampler takes shard {rank} of {replicas}, but this task streams shard "
            f"{shard} of {num_shards}: build it with num_replicas=num_streamers() and rank=get_streaming_rank() "
            "(or leave the sampler out and let cbtorch.dataloader shard)")
    size = len(cast(Sized, sampler.dataset))
    if size % replicas and not sampler.drop_last:
        raise DataLoaderError(
            f"the DataLoader's DistributedSampler pads its shard with repeated samples ({size} samples over "
            f"{replicas} streamers): use a sample count divisible by {replicas} or drop_last=True")


class ShardSampler(Sampler[int]):
    """Every ``num_shards``-th index of ``base`` starting at ``shard``; can leave out a prefix.

    :attr:`skip` samples of this shard are left out of the next pass only (then it resets
    to 0): resuming skips whole batches without loading them.
    """

    def __init__(self, base: Any, shard: int, num_shards: int) -> None:
        self.base, self.shard, self.num_shards = base, shard, num_shards
        self.skip = 0

    def __iter__(self) -> Iterator[int]:
        skip, self.skip = self.skip, 0
        position = 0
        for i, index in enumerate(self.base):
            if i % self.num_shards == self.shard:
                if position >= skip:
                    yield index
                position += 1

    def __len__(self) -> int:
        return len(self.base) // self.num_shards


_LOADER_OPTIONS = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
                   "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers",
                   "pin_memory_device", "in_order")


def shard_loader(loader: DataLoader, plan: ShardPlan) -> tuple[DataLoader, ShardSampler | None]:
    """A DataLoader over this task's shard (same options), and its sampler (None for iterable datasets)."""
    options: dict[str, Any] = {}
    for name in _LOADER_OPTIONS:
        if hasattr(loader, name):
            options[name] = getattr(loader, name)
    if options.get("num_workers", 0) == 0:
        options.pop("prefetch_factor", None)
        options.pop("persistent_workers", None)
    if plan.self_sharding:
        return loader, None
    if plan.iterable:
        return DataLoader(loader.dataset, batch_size=plan.batch_size, drop_last=plan.batch_size is not None,
                          **options), None
    base = loader.sampler if loader.batch_size is not None else cast(BatchSampler, loader.batch_sampler).sampler
    sampler = ShardSampler(base, 0, 1) if plan.presharded else ShardSampler(base, plan.shard, plan.num_shards)
    return DataLoader(loader.dataset, batch_size=plan.batch_size, sampler=sampler, drop_last=True,
                      **options), sampler


class LoaderSource:
    """This task's shard as a :class:`~csrun.stream.source.BatchSource` (epoch after epoch)."""

    def __init__(self, loader: DataLoader, sampler: ShardSampler | None, plan: ShardPlan) -> None:
        self._loader, self._sampler, self._plan = loader, sampler, plan

    def batches_per_epoch(self) -> int | None:
        """Batches per epoch of this shard (None for iterable datasets)."""
        return self._plan.batches_per_epoch

    def stream(self, skip: int) -> Iterator[Any]:
        """Batches epoch after epoch with EPOCH_END between; the first ``skip`` left out."""
        per_epoch = self._plan.batches_per_epoch
        if self._sampler is not None and per_epoch:
            epochs, within = divmod(skip, per_epoch)
            for _ in range(epochs):  # replay skipped epochs without loading a sample
                self._sampler.skip = len(self._sampler)
                for _ in self._loader:
                    pass
            self._sampler.skip = within * (self._plan.batch_size or 0)
            while True:
                yield from self._loader
                yield EPOCH_END
        skipped = 0
        while True:
            seen = emitted = 0
            for batch in self._loader:
                seen += 1
                if skipped < skip:
                    skipped += 1
                    continue
                emitted += 1
                yield batch
            if emitted or not seen:
                yield EPOCH_END
