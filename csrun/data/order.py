"""The sample order of an epoch and how it is split across streamers: pure functions, no I/O.

The order is a pure function of ``(num_samples, shuffle, shuffle_seed, epoch)``; the split
is a pure function of that order and ``(batch_size, num_shards, drop_last_batch)``. Every
streamer computes the same order on its own, so no coordination is needed, and a resumed run
(same data, seed, epoch, streamer count) sees exactly the same batches.

**Order.** Without shuffling: ``0, 1, ..., N-1``. With shuffling: each sample ``i`` gets a
64-bit key from the SplitMix64 mixer of ``(shuffle_seed, epoch, i)`` and the order is the
samples sorted by key — a seeded permutation that is different every epoch and, being plain
integer arithmetic, the same on every machine and every numpy/torch version.

**Split (batch round-robin).** Cut the epoch order into global batches of ``batch_size``;
streamer ``k`` of ``S`` takes global batches ``k, k+S, k+2S, ...``. The chief receives
batches round-robin over streamers (streamer 0, 1, ..., S-1, 0, ...), so the sequence it sees
is global batch 0, 1, 2, ... — the same sequence for any number of streamers. Every shard
gets the same number of samples; what does not fit is dropped and reported
(:attr:`ShardLayout.dropped_samples`); because the order changes every epoch, a different
remainder is dropped each epoch.

* ``drop_last_batch=True`` (what the system needs): each shard gets
  ``N // (batch_size*S)`` full batches.
* ``drop_last_batch=False``: each shard gets ``N // S`` samples; the last round of batches is
  a partial batch of the same size on every shard, taken from consecutive positions of the
  order, so the round-robin sequence still reads the order from its start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from csrun.data.errors import DataError

_MASK64 = (1 << 64) - 1


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function over a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def epoch_order(num_samples: int, *, shuffle: bool, shuffle_seed: int, epoch: int) -> np.ndarray:
    """The sample indices of one epoch, in order (int64, length ``num_samples``)."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    key = _splitmix64(np.array([shuffle_seed & _MASK64], dtype=np.uint64))
    key = _splitmix64(key ^ np.uint64(epoch & _MASK64))
    with np.errstate(over="ignore"):
        keys = _splitmix64(np.arange(num_samples, dtype=np.uint64) + key)
    return np.argsort(keys, kind="stable").astype(np.int64)


@dataclass(frozen=True, kw_only=True)
class ShardLayout:
    """How one epoch of ``num_samples`` samples splits into equal shards of batches."""

    num_samples: int
    """Samples in the whole data set."""
    batch_size: int
    """Samples per batch."""
    num_shards: int = 1
    """Number of shards (streamers; 1 on a lone chief)."""
    drop_last_batch: bool = True
    """True: only full batches; False: a final, smaller batch of the same size on every shard."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "num_shards"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DataError(f"{name} must be a positive integer, got {value!r}")
        if self.samples_per_shard == 0:
            raise DataError(
                f"the data holds {self.num_samples} samples: too few for {self.num_shards} "
                f"shard(s) of at least one batch of {self.batch_size}; use a smaller batch_size, "
                "more data or fewer streamers")

    @property
    def samples_per_shard(self) -> int:
        """Samples each shard yields per epoch (the same on every shard)."""
        if self.drop_last_batch:
            return self.num_samples // (self.batch_size * self.num_shards) * self.batch_size
        return self.num_samples // self.num_shards

    @property
    def batches_per_shard(self) -> int:
        """Batches each shard yields per epoch."""
        return -(-self.samples_per_shard // self.batch_size)

    @property
    def global_batches_per_epoch(self) -> int:
        """Batches per epoch over all shards (what the chief sees)."""
        return self.batches_per_shard * self.num_shards

    @property
    def dropped_samples(self) -> int:
        """Samples of each epoch's order that no shard yields (the remainder)."""
        return self.num_samples - self.samples_per_shard * self.num_shards

    def batch_span(self, shard_index: int, local_batch: int) -> tuple[int, int]:
        """``(start, stop)`` positions in the epoch order of shard ``shard_index``'s batch ``local_batch``."""
        if not 0 <= shard_index < self.num_shards:
            raise DataError(f"shard_index must be in 0..{self.num_shards - 1}, got {shard_index!r}")
        if not 0 <= local_batch < self.batches_per_shard:
            raise DataError(f"batch {local_batch} is outside 0..{self.batches_per_shard - 1}")
        full_rounds = self.samples_per_shard // self.batch_size
        if local_batch < full_rounds:
            start = (local_batch * self.num_shards + shard_index) * self.batch_size
            return start, start + self.batch_size
        rest = self.samples_per_shard - full_rounds * self.batch_size
        start = full_rounds * self.num_shards * self.batch_size + shard_index * rest
        return start, start + rest

    def resume_point(self, shard_index: int, global_batches_done: int) -> tuple[int, int]:
        """Where shard ``shard_index`` starts after the chief has consumed ``global_batches_done`` batches.

        Returns ``(epochs_done, local_batches_to_skip)``: the global batches form the
        round-robin sequence, so of the first ``g`` batches of an epoch shard ``k`` produced
        those with ``j*S + k < g``.
        """
        if isinstance(global_batches_done, bool) or not isinstance(global_batches_done, int) \
                or global_batches_done < 0:
            raise DataError(f"skip_batches must be a non-negative integer, got {global_batches_done!r}")
        epochs, within = divmod(global_batches_done, self.global_batches_per_epoch)
        skip = max(0, -(-(within - shard_index) // self.num_shards))
        return epochs, skip
