"""The ``train_input`` / ``eval_input`` section, modelled once, read by :mod:`csrun.typed_config`.

:class:`InputConfig` holds the keys every input pipeline has (``data_dir``, ``batch_size``,
shuffling, DataLoader workers); the runner's params (:mod:`csrun.run.params`) and every model
use it, directly or through a subclass that adds the model's own keys.
:class:`HDF5InputConfig` adds the legacy processor keys the HDF5 loaders read
(``data_processor``, ``max_sequence_length``, ``max_predictions_per_seq``, ``vocab_file``,
``int_dtype``); BERT's and GPT-2's input sections are subclasses of it that narrow the
processor and set its defaults, so a section is handed to :func:`~csrun.data.hdf5_dataloader`
as it is, with no field copied.

A section is read by :meth:`InputConfig.from_params` (or by the runner's ``params_from_dict``,
which reads it the same way): an unknown key names its path, suggests the closest key and lists
the valid keys with their defaults; a wrong type or an out-of-range value names the key and the
value. Every such problem is a :class:`~csrun.errors.ConfigError` (exit 2).

``shuffle_seed`` defaults to 0: every streamer must draw the same permutation, so the seed is
never left to chance. :meth:`HDF5InputConfig.check_against` checks the processor keys (and the
model's ``vocab_size``) against the data's ``metadata.json``, so a params file and a data set
that disagree fail before the first step, naming both values (a
:class:`~csrun.data.errors.DataError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, TypeVar

from csrun.data.errors import DataError
from csrun.data.formats import MAX_SAMPLES, MAX_SEQ_LENGTH, DatasetMetadata
from csrun.data.hdf5_dataset import MAX_WORKERS
from csrun.errors import ConfigError
from csrun.typed_config import check_fields, from_mapping, required, setting

DATA_PROCESSORS = {"BertHDF5DataProcessor": "mlm_nsp", "GptHDF5DataProcessor": "causal_lm"}
"""Legacy-style processor names and the format each reads."""

InputT = TypeVar("InputT", bound="InputConfig")
MAX_PREFETCH = 64
"""The most batches ``prefetch_factor`` asks each worker for (the chief's ring holds as many per streamer)."""


@dataclass(kw_only=True)
class InputConfig:
    """``train_input`` / ``eval_input``: the input pipeline; models subclass it with their own keys."""

    data_dir: str = setting("", "where the data is (the directory cs_convert_hdf5 wrote; '' for a model's bundled "
                                "or synthetic data)")
    batch_size: int = required("samples per batch: each step trains on one batch, from one streamer in turn", min=1,
                               max=MAX_SAMPLES)
    shuffle: bool = setting(True, "shuffle the samples, with a new seeded permutation every epoch")
    shuffle_seed: int = setting(0, "seed of the shuffle (every streamer draws the same permutation)", min=0)
    drop_last_batch: bool = setting(True, "drop a short last batch (the system needs static shapes)")
    num_workers: int = setting(0, "DataLoader worker processes per streamer", min=0, max=MAX_WORKERS)
    prefetch_factor: int | None = setting(None, "batches each worker prefetches (needs num_workers > 0); "
                                                "also the stream's ring size", min=1, max=MAX_PREFETCH)
    persistent_workers: bool = setting(False, "keep DataLoader workers between epochs (only with workers)")

    @classmethod
    def from_params(cls: type[InputT], section: Mapping[str, Any], path: str = "train_input") -> InputT:
        """Read and check one params section (``params["train_input"]``); ``path`` names it in errors."""
        config = from_mapping(cls, section, path)
        config.check(path)
        return config

    def check(self, path: str) -> None:
        """Refuse wrong types, out-of-range values and impossible combinations, naming the keys under ``path``."""
        check_fields(self, path)
        if self.prefetch_factor is not None and self.num_workers == 0:
            raise ConfigError(f"{path}.prefetch_factor: needs num_workers > 0 (torch's DataLoader rule)")


@dataclass(kw_only=True)
class HDF5InputConfig(InputConfig):
    """An input section for HDF5 data written by ``cs_convert_hdf5``, with the legacy processor keys."""

    data_processor: Literal["BertHDF5DataProcessor", "GptHDF5DataProcessor"] | None = setting(
        None, "BertHDF5DataProcessor (mlm_nsp data) or GptHDF5DataProcessor (causal_lm data); "
              "checked against the data when given")
    max_sequence_length: int | None = setting(None, "tokens per sample; must equal the data's max_seq_length", min=1,
                                              max=MAX_SEQ_LENGTH)
    max_predictions_per_seq: int | None = setting(None, "masked positions per sample; must equal the data's", min=1,
                                                  max=MAX_SEQ_LENGTH)
    vocab_file: str | None = setting(None, "a vocab.txt whose token count must equal the data's vocab_size")
    int_dtype: Literal["int64", "stored"] = setting("int64", "integer fields as int64, or as stored (int32, the system's)")

    def check_against(self, meta: DatasetMetadata, *, vocab_size: int | None = None) -> None:
        """Raise :class:`DataError` where the processor keys, or the model's ``vocab_size``, disagree with the data.

        ``vocab_size`` (the model's) must be at least the data's: a model may pad its vocabulary.
        """
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
        if vocab_size is not None and vocab_size < meta.vocab_size:
            raise DataError(f"vocab_size {vocab_size} is smaller than the vocabulary of {where} "
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
