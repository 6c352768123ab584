"""``train_input`` / ``eval_input`` for the HDF5 processors, as one typed dataclass.

:meth:`HDF5InputConfig.from_params` takes the YAML section as a mapping; an unknown key is an
error that lists the known ones. The processor fields (``max_sequence_length``,
``max_predictions_per_seq``, ``vocab_size``, ``vocab_file``, ``data_processor``) are optional;
when given they are checked against the data's ``metadata.json`` (:meth:`check_against`), so a
params file and a data set that disagree fail before the first step, naming both values.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from csrun.data.errors import DataError
from csrun.data.formats import DatasetMetadata

DATA_PROCESSORS = {"BertHDF5DataProcessor": "mlm_nsp", "GptHDF5DataProcessor": "causal_lm"}
"""Legacy-style processor names and the format each reads."""


@dataclass(frozen=True, kw_only=True)
class HDF5InputConfig:
    """One ``train_input``/``eval_input`` section for HDF5 data."""

    data_dir: str
    """The directory ``cs_convert_hdf5`` wrote (shards + metadata.json)."""
    batch_size: int
    """Samples per batch (per streamer)."""
    shuffle: bool = True
    """Shuffle the samples, with a new seeded permutation every epoch."""
    shuffle_seed: int | None = None
    """Seed of the shuffle (None means 0: every streamer must draw the same permutation)."""
    drop_last_batch: bool = True
    """Only full batches (the system needs it)."""
    num_workers: int = 0
    """DataLoader worker processes."""
    prefetch_factor: int | None = None
    """Batches each worker loads ahead (None: torch's default; only with workers)."""
    persistent_workers: bool = False
    """Keep workers alive between epochs (only with workers)."""
    int_dtype: str = "int64"
    """Integer fields as torch ``int64`` (default) or as ``stored`` (int32)."""
    data_processor: str | None = None
    """Optional: ``BertHDF5DataProcessor`` (mlm_nsp) or ``GptHDF5DataProcessor`` (causal_lm)."""
    max_sequence_length: int | None = None
    """Optional: must equal the data's max_seq_length."""
    max_predictions_per_seq: int | None = None
    """Optional: must equal the data's max_predictions_per_seq."""
    vocab_size: int | None = None
    """Optional: must be at least the data's vocab_size (a model may pad its vocabulary)."""
    vocab_file: str | None = None
    """Optional: a vocab.txt whose token count must equal the data's vocab_size."""

    def __post_init__(self) -> None:
        _check_type("data_dir", self.data_dir, str)
        for name in ("batch_size", "num_workers", "prefetch_factor", "max_sequence_length",
                     "max_predictions_per_seq", "vocab_size", "shuffle_seed"):
            value = getattr(self, name)
            if value is None and name not in ("batch_size", "num_workers"):
                continue
            _check_type(name, value, int)
            lowest = {"batch_size": 1, "prefetch_factor": 1, "max_sequence_length": 1,
                      "max_predictions_per_seq": 1, "vocab_size": 1, "num_workers": 0}.get(name)
            if lowest is not None and value < lowest:
                raise DataError(f"{name} must be at least {lowest}, got {value!r}")
        for name in ("shuffle", "drop_last_batch", "persistent_workers"):
            _check_type(name, getattr(self, name), bool)
        if self.int_dtype not in ("int64", "stored"):
            raise DataError(f"int_dtype must be 'int64' or 'stored', got {self.int_dtype!r}")
        if self.data_processor is not None and self.data_processor not in DATA_PROCESSORS:
            raise DataError(f"data_processor {self.data_processor!r} is not an HDF5 processor: use one "
                            f"of {', '.join(DATA_PROCESSORS)}")

    @classmethod
    def from_params(cls, section: Mapping[str, Any]) -> "HDF5InputConfig":
        """Build from a params section (``params["train_input"]``); unknown keys are errors."""
        if not isinstance(section, Mapping):
            raise DataError(f"the input section must be a mapping, got {type(section).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise DataError(f"unknown input key(s) {', '.join(map(repr, unknown))}; known keys: "
                            f"{', '.join(sorted(known))}")
        missing = [k for k in ("data_dir", "batch_size") if k not in section]
        if missing:
            raise DataError(f"the input section needs {' and '.join(missing)}")
        return cls(**dict(section))

    def check_against(self, meta: DatasetMetadata) -> None:
        """Raise :class:`DataError` where the optional processor fields disagree with the data."""
        where = f"the data in {self.data_dir!r}"
        if self.data_processor is not None and DATA_PROCESSORS[self.data_processor] != meta.format:
            raise DataError(f"data_processor {self.data_processor!r} reads {DATA_PROCESSORS[self.data_processor]} "
                            f"but {where} is {meta.format}")
        if self.max_sequence_length is not None and self.max_sequence_length != meta.max_seq_length:
            raise DataError(f"max_sequence_length {self.max_sequence_length} does not match {where} "
                            f"(max_seq_length {meta.max_seq_length})")
        if self.max_predictions_per_seq is not None and self.max_predictions_per_seq != meta.max_predictions_per_seq:
            raise DataError(f"max_predictions_per_seq {self.max_predictions_per_seq} does not match {where} "
                            f"(max_predictions_per_seq {meta.max_predictions_per_seq})")
        if self.vocab_size is not None and self.vocab_size < meta.vocab_size:
            raise DataError(f"vocab_size {self.vocab_size} is smaller than the vocabulary of {where} "
                            f"({meta.vocab_size} tokens)")
        if self.vocab_file is not None:
            path = Path(self.vocab_file)
            if not path.is_file():
                raise DataError(f"vocab_file {self.vocab_file!r} does not exist")
            with path.open(encoding="utf-8") as f:
                count = sum(1 for _ in f)
            if count != meta.vocab_size:
                raise DataError(f"vocab_file {self.vocab_file!r} holds {count} tokens but {where} was "
                                f"tokenized with {meta.vocab_size}")


def _check_type(name: str, value: Any, kind: type) -> None:
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        raise DataError(f"{name} must be {'an integer' if kind is int else 'a ' + kind.__name__}, "
                        f"got {value!r}")
