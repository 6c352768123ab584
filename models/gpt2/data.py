"""GPT-2 input functions: ``causal_lm`` HDF5 data written by ``cs_convert_hdf5``, sharded per streamer.

``train_input`` / ``eval_input`` are :class:`GptInputConfig`: the common input keys plus the
legacy processor fields (``data_processor``, ``max_sequence_length``, ``vocab_file``), checked
against the data's ``metadata.json`` before the first step, as is the model's ``vocab_size``.

``data_dir: ""`` means the bundled debug data, :data:`DEBUG_DATA_DIR` (MSL 32, 512-token
vocabulary; converted from ``../bert/data/tiny_corpus.txt`` by :data:`DEBUG_CONVERT_FLAGS` and
committed, so a debug run needs no conversion).
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
    "--input", "models/bert/data/tiny_corpus.txt", "--format", "causal_lm", "--max_seq_length", "32",
    "--vocab_file", "models/bert/data/vocab.txt",
)
"""``cs_convert_hdf5`` flags (run from the repository root) that made :data:`DEBUG_DATA_DIR`
(the BERT debug corpus and its fixed vocabulary; causal_lm conversion has no randomness)."""


@dataclass(kw_only=True)
class GptInputConfig(InputConfig):
    """``train_input`` / ``eval_input`` for GPT-2 on HDF5 data."""

    data_processor: Literal["GptHDF5DataProcessor"] = doc("GptHDF5DataProcessor", "reads cs_convert_hdf5 causal_lm data")
    max_sequence_length: int = doc(1024, "tokens per sample; must equal the data's max_seq_length")
    vocab_file: str | None = doc(None, "optional: a vocab.txt that must match the data's vocabulary size")
    int_dtype: Literal["int64", "stored"] = doc("int64", "integer fields as int64, or as stored (int32, the system's)")

    def check(self, path: str) -> None:
        """Refuse impossible values, naming the keys under ``path``."""
        super().check(path)
        if self.max_sequence_length < 2:
            raise ConfigError(f"{path}.max_sequence_length: {self.max_sequence_length} must be at least 2")


def data_dir_of(cfg: InputConfig) -> str:
    """The data directory: ``cfg.data_dir``, or the bundled debug data when it is empty."""
    return cfg.data_dir or str(DEBUG_DATA_DIR)


def hdf5_config(cfg: GptInputConfig, *, vocab_size: int | None = None) -> HDF5InputConfig:
    """The :class:`HDF5InputConfig` of an input section (``vocab_size``: the model's, checked)."""
    return HDF5InputConfig(
        data_dir=data_dir_of(cfg), batch_size=cfg.batch_size, shuffle=cfg.shuffle, shuffle_seed=cfg.shuffle_seed,
        drop_last_batch=cfg.drop_last_batch, num_workers=cfg.num_workers, prefetch_factor=cfg.prefetch_factor,
        persistent_workers=cfg.persistent_workers, int_dtype=cfg.int_dtype, data_processor=cfg.data_processor,
        max_sequence_length=cfg.max_sequence_length, vocab_size=vocab_size, vocab_file=cfg.vocab_file)


train_input_dataloader, eval_input_dataloader = hdf5_input_fns(GptInputConfig, hdf5_config, "GPT-2")
