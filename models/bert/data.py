"""BERT input functions: ``mlm_nsp`` HDF5 data written by ``cs_convert_hdf5``, sharded per streamer.

``train_input`` / ``eval_input`` are :class:`BertInputConfig`, a
:class:`~csrun.data.HDF5InputConfig` (the one model of an input section) that narrows the legacy
processor fields to BERT's (``data_processor``, ``max_sequence_length``,
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
from csrun.data.formats import MAX_SEQ_LENGTH
from csrun.run.inputs import hdf5_input_fns, with_data_dir
from csrun.run.params import doc
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
class BertInputConfig(HDF5InputConfig):
    """``train_input`` / ``eval_input`` for BERT pretraining on HDF5 data."""

    data_processor: Literal["BertHDF5DataProcessor"] = doc("BertHDF5DataProcessor", "reads cs_convert_hdf5 mlm_nsp data")
    max_sequence_length: int = doc(128, "tokens per sample; must equal the data's max_seq_length", min=5,
                                   max=MAX_SEQ_LENGTH)
    max_predictions_per_seq: int = doc(20, "masked positions per sample; must equal the data's", min=1,
                                       max=MAX_SEQ_LENGTH)

    def check(self, path: str) -> None:
        """Refuse impossible values, naming the keys under ``path``."""
        super().check(path)
        if not 1 <= self.max_predictions_per_seq <= self.max_sequence_length - 3:
            raise ConfigError(f"{path}.max_predictions_per_seq: {self.max_predictions_per_seq} must be in "
                              f"1..{self.max_sequence_length - 3}")


def resolved(cfg: BertInputConfig) -> BertInputConfig:
    """The section as the loader reads it: ``data_dir: ""`` is the bundled debug data."""
    return with_data_dir(cfg, DEBUG_DATA_DIR)


train_input_dataloader, eval_input_dataloader = hdf5_input_fns(BertInputConfig, "BERT", DEBUG_DATA_DIR)
