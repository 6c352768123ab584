"""Writing HDF5 shards without ever leaving a half-written data directory.

:class:`StagedOutput` writes everything into a hidden staging folder inside the output
directory and moves the files into place only when all of them are complete, ``metadata.json``
last; on any error the staging folder (and an output directory it created) is removed, and an
existing data set is left as it was. :class:`ShardWriter` turns a stream of sample dicts into
``shard_NNNNN.h5`` files of ``samples_per_shard`` samples each.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any, Mapping

import numpy as np

from csrun.data.errors import DataError
from csrun.data.formats import METADATA_FILE, SHARD_PATTERN, VOCAB_FILE, ShardRecord

_OURS = (METADATA_FILE, VOCAB_FILE)


def check_output_dir(output_dir: Path, *, overwrite: bool) -> None:
    """Refuse an output directory that is a file, or is not empty while ``overwrite`` is off."""
    if output_dir.exists() and not output_dir.is_dir():
        raise DataError(f"--output_dir {str(output_dir)!r} exists and is not a directory")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        raise DataError(f"--output_dir {str(output_dir)!r} is not empty: choose a new directory or "
                        "pass --overwrite to replace the data set in it")


class StagedOutput:
    """A context manager: stage files with :meth:`path`, publish them all with :meth:`commit`."""

    def __init__(self, output_dir: Path, *, overwrite: bool) -> None:
        check_output_dir(output_dir, overwrite=overwrite)
        self.output_dir = output_dir
        self._created = not output_dir.exists()
        try:
            output_dir.mkdir(parents=True, exist_ok=True)
            self._stage = Path(tempfile.mkdtemp(prefix=".cs_convert_hdf5-", dir=output_dir))
        except OSError as exc:
            raise DataError(f"cannot create --output_dir {str(output_dir)!r}: {exc.strerror}") from None
        self._names: list[str] = []
        self._committed = False

    def path(self, name: str) -> Path:
        """Where to write file ``name`` now (inside the staging folder)."""
        self._names.append(name)
        return self._stage / name

    def commit(self) -> None:
        """Replace any previous data set's files, then move the staged files in, metadata last."""
        for old in self.output_dir.iterdir():
            if old.is_file() and (old.name in _OURS or (old.name.startswith("shard_") and old.suffix == ".h5")):
                old.unlink()
        names = sorted(self._names, key=lambda n: n == METADATA_FILE)
        for name in names:
            os.replace(self._stage / name, self.output_dir / name)
        self._stage.rmdir()
        self._committed = True

    def __enter__(self) -> "StagedOutput":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._committed:
            return
        shutil.rmtree(self._stage, ignore_errors=True)
        if self._created:
            shutil.rmtree(self.output_dir, ignore_errors=True)


class ShardWriter:
    """Buffers samples and writes them as shards of ``samples_per_shard`` through a :class:`StagedOutput`."""

    def __init__(self, out: StagedOutput, *, fields: Mapping[str, tuple[str, tuple[int, ...]]],
                 samples_per_shard: int, attrs: Mapping[str, Any]) -> None:
        self._out, self._fields, self._per_shard = out, dict(fields), samples_per_shard
        self._attrs = dict(attrs)
        self._buffer: list[Mapping[str, np.ndarray]] = []
        self.records: list[ShardRecord] = []

    def add(self, sample: Mapping[str, Any]) -> None:
        """Add one sample (field name -> array of that field's per-sample shape)."""
        self._buffer.append(sample)
        if len(self._buffer) == self._per_shard:
            self._flush()

    def finish(self) -> list[ShardRecord]:
        """Write the last, possibly smaller shard; the records of all shards written."""
        if self._buffer:
            self._flush()
        return self.records

    def _flush(self) -> None:
        import h5py

        name = SHARD_PATTERN.format(len(self.records))
        count = len(self._buffer)
        with h5py.File(self._out.path(name), "w") as f:
            for key, (dtype, shape) in self._fields.items():
                data = np.asarray([s[key] for s in self._buffer], dtype=dtype).reshape((count, *shape))
                f.create_dataset(key, data=data)
            for key, value in self._attrs.items():
                f.attrs[key] = value
            f.attrs["shard_index"] = len(self.records)
            f.attrs["num_samples"] = count
        self.records.append(ShardRecord(file=name, num_samples=count))
        self._buffer = []
