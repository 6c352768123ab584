"""The HDF5 processors: torch datasets over a directory written by ``cs_convert_hdf5``.

* :class:`HDF5Dataset` — map-style, every sample by index. Hand it to a plain
  ``DataLoader(batch_size=..., drop_last=True)`` and let ``cbtorch.dataloader`` shard it.
* :class:`HDF5ShardDataset` — iterable, the legacy streamer way: built with the streaming
  rank and the number of streamers (``cbtorch.task_id()``, ``cbtorch.num_tasks()``), it yields
  only its shard's samples, in the order of :mod:`csrun.data.order` (seeded shuffle per
  epoch, batch round-robin split, equal shards, remainder dropped and reported), and can
  start mid-epoch (``skip_batches``) for an exact resume.

Samples are dicts of tensors, one entry per field of the format (see
:mod:`csrun.data.formats`). Integer fields are stored int32 (the legacy system's dtype) and
returned as torch int64 (what PyTorch losses and embeddings want) unless
``int_dtype="stored"``; ``masked_lm_weights`` is float32 either way. Files are opened lazily
in the process that reads (see :mod:`csrun.data.hdf5_reader`), so ``num_workers > 0`` is safe.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.sharedctypes
from multiprocessing.context import get_spawning_popen
from pathlib import Path
from typing import Any, Iterator, Literal

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from csrun.data.errors import DataError
from csrun.data.formats import DatasetMetadata
from csrun.data.hdf5_reader import ShardReader
from csrun.data.order import ShardLayout, epoch_order

IntDtype = Literal["int64", "stored"]
"""How integer fields come back: torch int64, or the stored int32."""

MAX_WORKERS = 128
"""Most DataLoader workers one :class:`HDF5ShardDataset` supports."""

_log = logging.getLogger("csrun.data")


def _to_tensors(arrays: dict[str, np.ndarray], int_dtype: IntDtype) -> dict[str, torch.Tensor]:
    out = {}
    for name, array in arrays.items():
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if int_dtype == "int64" and not tensor.is_floating_point():
            tensor = tensor.to(torch.int64)
        out[name] = tensor
    return out


def _check_int_dtype(int_dtype: str) -> None:
    if int_dtype not in ("int64", "stored"):
        raise DataError(f"int_dtype must be 'int64' or 'stored', got {int_dtype!r}")


class HDF5Dataset(Dataset):
    """Map-style: sample ``i`` of the data set in ``data_dir`` as a dict of tensors."""

    def __init__(self, data_dir: str | Path, *, int_dtype: IntDtype = "int64") -> None:
        _check_int_dtype(int_dtype)
        self.reader = ShardReader(data_dir)
        self.int_dtype = int_dtype

    @property
    def metadata(self) -> DatasetMetadata:
        """The data set's ``metadata.json`` record."""
        return self.reader.metadata

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index < 0:
            index += len(self)
        batch = self.read_batch([index])
        return {name: t[0] for name, t in batch.items()}

    def __getitems__(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        """A batch's samples with one read per shard file (DataLoader's batched fetch)."""
        batch = self.read_batch(indices)
        return [{name: t[i] for name, t in batch.items()} for i in range(len(indices))]

    def read_batch(self, indices: Any) -> dict[str, torch.Tensor]:
        """The samples at ``indices``, stacked: field -> tensor ``[len(indices), ...]``."""
        return _to_tensors(self.reader.read(np.asarray(indices, dtype=np.int64)), self.int_dtype)


class HDF5ShardDataset(IterableDataset):
    """Iterable: shard ``shard_index`` of ``num_shards`` of the data set in ``data_dir`` (see the module doc).

    Each pass (each ``iter()``, i.e. each ``for`` over the DataLoader) is one epoch: the first
    pass is epoch ``epoch`` (advanced past ``skip_batches``), the next ones follow. The pass
    count and the start position live in shared memory, so the epoch advances, and
    :meth:`set_epoch` / :meth:`skip_shard_batches` take effect, with ``num_workers`` 0 or more,
    persistent workers or not (call them between passes).
    With workers, worker ``w`` of ``W`` reads batches ``w, w+W, ...`` of the pass, whole, and
    the DataLoader's in-order delivery puts them back in sequence: the order does not depend
    on ``num_workers``.
    """

    def __init__(self, data_dir: str | Path, *, batch_size: int, shard_index: int = 0,
                 num_shards: int = 1, shuffle: bool = True, shuffle_seed: int | None = None,
                 drop_last_batch: bool = True, epoch: int = 0, skip_batches: int = 0,
                 int_dtype: IntDtype = "int64") -> None:
        _check_int_dtype(int_dtype)
        self.reader = ShardReader(data_dir)
        self.layout = ShardLayout(num_samples=len(self.reader), batch_size=batch_size,
                                  num_shards=num_shards, drop_last_batch=drop_last_batch)
        if isinstance(shard_index, bool) or not isinstance(shard_index, int) \
                or not 0 <= shard_index < num_shards:
            raise DataError(f"shard_index must be in 0..{num_shards - 1}, got {shard_index!r}")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise DataError(f"epoch must be a non-negative integer, got {epoch!r}")
        self.shard_index, self.shuffle, self.int_dtype = shard_index, bool(shuffle), int_dtype
        self.shuffle_seed = 0 if shuffle_seed is None else int(shuffle_seed)
        self._start_epoch = epoch
        # shared across DataLoader workers: [passes started by worker 0..MAX_WORKERS-1, base epoch, first skip]
        self._shared: Any = multiprocessing.sharedctypes.RawArray("q", MAX_WORKERS + 2)
        epochs_done, first_skip = self.layout.resume_point(shard_index, skip_batches)
        self._restart(epoch + epochs_done, first_skip)
        self._order_cache: tuple[int, np.ndarray] | None = None
        if self.layout.dropped_samples:
            _log.info("shard %d/%d: %d of %d samples per epoch left out so every shard holds %d "
                      "samples (%d batches of %d)", shard_index, num_shards,
                      self.layout.dropped_samples, self.layout.num_samples,
                      self.layout.samples_per_shard, self.layout.batches_per_shard, batch_size)

    @property
    def metadata(self) -> DatasetMetadata:
        """The data set's ``metadata.json`` record."""
        return self.reader.metadata

    @property
    def dropped_samples(self) -> int:
        """Samples per epoch that no shard yields (so that all shards are equal)."""
        return self.layout.dropped_samples

    def __len__(self) -> int:
        """Samples this shard yields in one full epoch."""
        return self.layout.samples_per_shard

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if get_spawning_popen() is None:  # a plain copy (not a worker start): detach the counter
            state["_shared"] = list(self._shared)
        return state

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch``, from its start."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise DataError(f"epoch must be a non-negative integer, got {epoch!r}")
        self._restart(epoch, 0)

    def skip_shard_batches(self, count: int) -> None:
        """Start the next pass ``count`` of *this shard's* batches after the start of epoch ``epoch``.

        The streaming layer's per-streamer skip (``csrun.stream`` gives streamer ``k`` of ``S``
        ``g // S + (k < g % S)`` for a resume at global batch ``g``): the same position as
        ``skip_batches=g`` at construction, without reading the skipped batches.
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise DataError(f"skip must be a non-negative integer, got {count!r}")
        epochs, within = divmod(count, self.layout.batches_per_shard)
        self._restart(self._start_epoch + epochs, within)

    def _restart(self, epoch: int, first_skip: int) -> None:
        for i in range(MAX_WORKERS):
            self._shared[i] = 0
        self._shared[MAX_WORKERS], self._shared[MAX_WORKERS + 1] = epoch, first_skip

    def _order(self, epoch: int) -> np.ndarray:
        if self._order_cache is None or self._order_cache[0] != epoch:
            self._order_cache = (epoch, epoch_order(self.layout.num_samples, shuffle=self.shuffle,
                                                    shuffle_seed=self.shuffle_seed, epoch=epoch))
        return self._order_cache[1]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        if workers > MAX_WORKERS:
            raise DataError(f"num_workers {workers} is more than HDF5ShardDataset supports ({MAX_WORKERS})")
        passes = self._shared[worker]  # claimed now, not at the first next(): every worker counts every pass
        self._shared[worker] = passes + 1
        epoch = self._shared[MAX_WORKERS] + passes
        skip = self._shared[MAX_WORKERS + 1] if passes == 0 else 0
        return self._samples(epoch, skip, worker, workers)

    def _samples(self, epoch: int, skip: int, worker: int, workers: int) -> Iterator[dict[str, torch.Tensor]]:
        order = self._order(epoch)
        for j in range(skip + worker, self.layout.batches_per_shard, workers):
            start, stop = self.layout.batch_span(self.shard_index, j)
            batch = _to_tensors(self.reader.read(order[start:stop]), self.int_dtype)
            for i in range(stop - start):
                yield {name: t[i] for name, t in batch.items()}
