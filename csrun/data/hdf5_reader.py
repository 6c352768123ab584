"""Reading rows from a folder of HDF5 shards, lazily and safely across DataLoader workers.

No file is opened when a reader is made: each process opens the shards on its first read
(a DataLoader worker opens its own handles; handles are never shared across a fork) and a
pickled reader (``spawn`` workers) carries paths only. Files are opened read-only with HDF5
file locking off, which shared file systems need.

Every shard is checked against the record before its first read, and every value read against
its field's range (:func:`~csrun.data.formats.value_ranges`: token ids inside the vocabulary,
masks and labels 0 or 1, positions inside the sequence, weights from 0 to 1) before it leaves
the reader: a value out of range is a :class:`DataError` naming the file, the field, the row
and the value, on the CPU path and on the device alike (both read batches here), never an
index error inside an embedding or a loss kernel.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from csrun.data.errors import DataError
from csrun.data.formats import DatasetMetadata, read_metadata, value_ranges


class ShardReader:
    """Rows of a converted data set by global sample index (shards concatenated in order)."""

    def __init__(self, data_dir: str | Path, metadata: DatasetMetadata | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.metadata = metadata if metadata is not None else read_metadata(self.data_dir)
        self.fields = list(self.metadata.fields)
        self._paths = [self.data_dir / s.file for s in self.metadata.shards]
        counts = np.array([s.num_samples for s in self.metadata.shards], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._ranges = value_ranges(self.metadata)
        self._handles: dict[int, Any] = {}
        self._pid: int | None = None

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handles"], state["_pid"] = {}, None
        return state

    def _file(self, index: int) -> Any:
        import h5py

        if self._pid != os.getpid():  # a new process (fork): never reuse the parent's handles
            self._handles, self._pid = {}, os.getpid()
        handle = self._handles.get(index)
        if handle is None:
            path = self._paths[index]
            try:
                handle = h5py.File(path, "r", locking=False)
            except OSError as exc:
                raise DataError(f"cannot open shard {str(path)!r}: {exc}") from None
            try:
                self._check_shard(handle, index)
            except BaseException:
                handle.close()
                raise
            self._handles[index] = handle
        return handle

    def _check_shard(self, handle: Any, index: int) -> None:
        """Each field of the shard is what the record says (a dataset of ``num_samples`` rows of the
        field's shape and dtype): :class:`DataError` naming the file, the field and the bad value,
        before anything is read or allocated from it."""
        import h5py

        path, rows = self._paths[index], self.metadata.shards[index].num_samples
        for name, spec in self.metadata.fields.items():
            link = handle.get(name, getlink=True)
            if link is None:
                raise DataError(f"shard {str(path)!r}: no dataset {name!r} (the record lists it)")
            if not isinstance(link, h5py.HardLink):
                raise DataError(f"shard {str(path)!r}: field {name!r} is a {type(link).__name__}, not a dataset of "
                                f"the shard's own (links are not followed)")
            ds = handle[name]
            if not isinstance(ds, h5py.Dataset):
                raise DataError(f"shard {str(path)!r}: {name!r} is a {type(ds).__name__}, not a dataset")
            if ds.is_virtual or ds.external:
                raise DataError(f"shard {str(path)!r}: field {name!r} reads other files (virtual or external "
                                f"storage); a shard holds its own data")
            want = (rows, *spec["shape"])
            if tuple(ds.shape) != want:
                raise DataError(f"shard {str(path)!r}: field {name!r} has shape {tuple(ds.shape)}; the record says "
                                f"{want}")
            if ds.dtype != np.dtype(spec["dtype"]):
                raise DataError(f"shard {str(path)!r}: field {name!r} is {ds.dtype}; the record says "
                                f"{spec['dtype']}")

    def read(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """The rows at ``indices`` (global sample numbers, any order, no repeats), stacked in that order."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            bad = indices[(indices < 0) | (indices >= len(self))][0]
            raise IndexError(f"sample {int(bad)} is outside 0..{len(self) - 1}")
        file_of = np.searchsorted(self._starts, indices, side="right") - 1
        out: dict[str, np.ndarray] = {}
        for f in np.unique(file_of):
            where = np.nonzero(file_of == f)[0]
            local = indices[where] - self._starts[f]
            order = np.argsort(local, kind="stable")
            local_sorted = local[order]
            handle = self._file(int(f))
            lo, hi = int(local_sorted[0]), int(local_sorted[-1]) + 1
            for name in self.fields:
                ds = handle[name]
                if hi - lo <= 4 * len(local_sorted):  # dense: one contiguous read, pick in memory
                    rows = ds[lo:hi][local_sorted - lo]
                else:
                    rows = ds[local_sorted]
                self._check_values(int(f), name, rows, local_sorted)
                if name not in out:
                    out[name] = np.empty((len(indices), *ds.shape[1:]), dtype=ds.dtype)
                out[name][where[order]] = rows
        if not out:
            for name, spec in self.metadata.fields.items():
                out[name] = np.empty((0, *spec["shape"]), dtype=spec["dtype"])
        return out

    def _check_values(self, index: int, name: str, rows: np.ndarray, local_rows: np.ndarray) -> None:
        """Every value of ``rows`` (field ``name`` of shard ``index`` at ``local_rows``) in its range
        (:func:`~csrun.data.formats.value_ranges`): DataError naming the file, field, row and value."""
        least, greatest, what = self._ranges[name]
        inside = (rows >= least) & (rows <= greatest)  # NaN is outside
        if inside.all():
            return
        where = tuple(int(i) for i in np.argwhere(~inside)[0])
        value = rows[where].item()
        at = f", position {where[1]}" if len(where) > 1 else ""
        raise DataError(f"shard {str(self._paths[index])!r}: field {name!r} row {int(local_rows[where[0]])}{at} holds "
                        f"{value!r}, outside {least}..{greatest} ({what}); fix or re-convert the data "
                        f"(cs_convert_hdf5)")

    def close(self) -> None:
        """Close this process's open shard files."""
        for handle in self._handles.values():
            handle.close()
        self._handles = {}
