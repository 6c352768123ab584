"""BERT input functions: ``mlm_nsp`` HDF5 data written by ``cs_convert_hdf5``, sharded per streamer.

``train_input`` / ``eval_input`` are :class:`BertInputConfig`: the common input keys plus the
legacy processor fields (``data_processor``, ``max_sequence_length``,
``max_predictions_per_seq``, ``vocab_file``), which are checked against the data's
``metadata.json`` before the first step; the model's ``vocab_size`` is checked too (it must
hold the data's vocabulary).

``data_dir: ""`` means the bundled debug data, :data:`DEBUG_DATA_DIR` (MSL 32, 5 predictions,
512-token vocabulary; converted from ``data/tiny_corpus.txt`` by :data:`DEBUG_CONVERT_FLAGS`
and committed, so a debug run needs no conversion).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from csrun.data import HDF5InputConfig
from csrun.run.inputs import hdf5_input_fns
from csrun.run.params import InputConfig, doc
from csrun.typed_config import ConfigError

HERE = Path(__file__).resolve().parent
DEBUG_DATA_DIR = HERE / "data" / "debug_hdf5"
"""The bundled debug data set (``data_dir: ""``)."""
DEBUG_CONVERT_FLAGS = (
    "--input", "models/bert/data/tiny_corpus.txt", "--format", "mlm_nsp", "--max_seq_length", "32",
    "--max_predictions_per_seq", "5", "--dupe_factor", "5", "--vocab_file", "models/bert/data/vocab.txt",
    "--seed", "1",
)
"""``cs_convert_hdf5`` flags (run from the repository root) that made :data:`DEBUG_DATA_DIR`.
``data/vocab.txt`` was trained once on the corpus and is kept fixed: the conversion with a
given vocabulary and seed is deterministic, tokenizer training is not."""


@dataclass(kw_only=True)
class BertInputConfig(InputConfig):
    """``train_input`` / ``eval_input`` for BERT pretraining on HDF5 data."""

    data_processor: Literal["BertHDF5DataProcessor"] = doc("BertHDF5DataProcessor", "reads cs_convert_hdf5 mlm_nsp data")
    max_sequence_length: int = doc(128, "tokens per sample; must equal the data's max_seq_length")
    max_predictions_per_seq: int = doc(20, "masked positions per sample; must equal the data's")
    vocab_file: str | None = doc(None, "optional: a vocab.txt that must match the data's vocabulary size")
    int_dtype: Literal["int64", "stored"] = doc("int64", "integer fields as int64, or as stored (int32, the system's)")

    def check(self, path: str) -> None:
        """Refuse impossible values, naming the keys under ``path``."""
        super().check(path)
        if self.max_sequence_length < 5:
            raise ConfigError(f"{path}.max_sequence_length: {self.max_sequence_length} must be at least 5")
        if not 1 <= self.max_predictions_per_seq <= self.max_sequence_length - 3:
            raise ConfigError(f"{path}.max_predictions_per_seq: {self.max_predictions_per_seq} must be in "
                              f"1..{self.max_sequence_length - 3}")


def data_dir_of(cfg: InputConfig) -> str:
    """The data directory: ``cfg.data_dir``, or the bundled debug data when it is empty."""
    return cfg.data_dir or str(DEBUG_DATA_DIR)


def hdf5_config(cfg: BertInputConfig, *, vocab_size: int | None = None) -> HDF5InputConfig:
    """The :class:`HDF5InputConfig` of an input section (``vocab_size``: the model's, checked)."""
    return HDF5InputConfig(
        data_dir=data_dir_of(cfg), batch_size=cfg.batch_size, shuffle=cfg.shuffle, shuffle_seed=cfg.shuffle_seed,
        drop_last_batch=cfg.drop_last_batch, num_workers=cfg.num_workers, prefetch_factor=cfg.prefetch_factor,
        persistent_workers=cfg.persistent_workers, int_dtype=cfg.int_dtype, data_processor=cfg.data_processor,
        max_sequence_length=cfg.max_sequence_length, max_predictions_per_seq=cfg.max_predictions_per_seq,
        vocab_size=vocab_size, vocab_file=cfg.vocab_file)


train_input_dataloader, eval_input_dataloader = hdf5_input_fns(BertInputConfig, hdf5_config, "BERT")
