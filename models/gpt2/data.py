"""GPT-2 input functions: ``causal_lm`` HDF5 data written by ``cs_convert_hdf5``, sharded per streamer.

``train_input`` / ``eval_input`` are :class:`GptInputConfig`, a :class:`~csrun.data.HDF5InputConfig`
(the one model of an input section) that narrows the legacy processor fields to GPT-2's
(``data_processor``, ``max_sequence_length``, ``vocab_file``; no ``max_predictions_per_seq``), checked
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
from csrun.data.formats import MAX_SEQ_LENGTH
from csrun.run.inputs import hdf5_input_fns, with_data_dir
from csrun.run.params import doc
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
class GptInputConfig(HDF5InputConfig):
    """``train_input`` / ``eval_input`` for GPT-2 on HDF5 data."""

    data_processor: Literal["GptHDF5DataProcessor"] = doc("GptHDF5DataProcessor", "reads cs_convert_hdf5 causal_lm data")
    max_sequence_length: int = doc(1024, "tokens per sample; must equal the data's max_seq_length", min=2,
                                   max=MAX_SEQ_LENGTH)

    def check(self, path: str) -> None:
        """Refuse impossible values, naming the keys under ``path``."""
        super().check(path)
        if self.max_predictions_per_seq is not None:
            raise ConfigError(f"{path}.max_predictions_per_seq: {self.max_predictions_per_seq!r}: causal_lm data has no "
                              "masked positions; remove the key")


def resolved(cfg: GptInputConfig) -> GptInputConfig:
    """The section as the loader reads it: ``data_dir: ""`` is the bundled debug data."""
    return with_data_dir(cfg, DEBUG_DATA_DIR)


train_input_dataloader, eval_input_dataloader = hdf5_input_fns(GptInputConfig, "GPT-2", DEBUG_DATA_DIR)
