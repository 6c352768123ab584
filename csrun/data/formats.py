"""The two sample formats and the ``metadata.json`` record beside the HDF5 shards.

A data directory written by ``cs_convert_hdf5`` holds ``shard_00000.h5``, ``shard_00001.h5``,
..., ``vocab.txt`` and ``metadata.json`` (written last: its presence means the directory is
complete). Each shard holds one HDF5 dataset per field, first dimension = samples in that
shard, contiguous (no chunking or compression: fast random row reads). Token ids are stored
as int32, as the legacy system wanted; readers return them as torch int64 by default.

``mlm_nsp`` (BERT pretraining; static masking, done once by the converter):

============================ ======= =========================== ==============================
field                        dtype   shape per sample            meaning
============================ ======= =========================== ==============================
``input_ids``                int32   ``[max_seq_length]``        ``[CLS] A [SEP] B [SEP]``, masked, padded with ``[PAD]``
``attention_mask``           int32   ``[max_seq_length]``        1 on real tokens, 0 on padding
``token_type_ids``           int32   ``[max_seq_length]``        0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``, 0 on padding
``masked_lm_positions``      int32   ``[max_predictions_per_seq]`` positions of the masked tokens (ascending), 0 padded
``masked_lm_ids``            int32   ``[max_predictions_per_seq]`` the original token ids there, 0 padded
``masked_lm_weights``        float32 ``[max_predictions_per_seq]`` 1.0 for a real prediction, 0.0 for padding
``next_sentence_label``      int32   ``[]``                      0: B follows A in the text; 1: B is random
============================ ======= =========================== ==============================

``causal_lm`` (GPT-style; documents packed back to back, ``[SEP]`` between them):

=================== ===== =================== ==========================================
``input_ids``       int32 ``[max_seq_length]`` tokens ``t[0..L-1]`` of a window, ``[PAD]`` padded
``attention_mask``  int32 ``[max_seq_length]`` 1 where ``labels`` holds a real next token
``labels``          int32 ``[max_seq_length]`` tokens ``t[1..L]``: the input shifted left by one
=================== ===== =================== ==========================================
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from csrun.data.errors import DataError

METADATA_FILE = "metadata.json"
"""The record a reader starts from, beside the shards."""
VOCAB_FILE = "vocab.txt"
"""The WordPiece vocabulary beside the shards (one token per line; id = line number)."""
SHARD_PATTERN = "shard_{:05d}.h5"
"""Shard file names."""
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""The special tokens every vocabulary must hold."""

FORMATS: dict[str, dict[str, tuple[str, str | None]]] = {
    "mlm_nsp": {
        "input_ids": ("int32", "seq"),
        "attention_mask": ("int32", "seq"),
        "token_type_ids": ("int32", "seq"),
        "masked_lm_positions": ("int32", "pred"),
        "masked_lm_ids": ("int32", "pred"),
        "masked_lm_weights": ("float32", "pred"),
        "next_sentence_label": ("int32", None),
    },
    "causal_lm": {
        "input_ids": ("int32", "seq"),
        "attention_mask": ("int32", "seq"),
        "labels": ("int32", "seq"),
    },
}
"""Per format: field name -> (stored dtype, per-sample length: ``seq``, ``pred`` or scalar)."""


def field_shapes(fmt: str, max_seq_length: int,
                 max_predictions_per_seq: int | None) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Per field of format ``fmt``: (stored dtype, per-sample shape)."""
    if fmt not in FORMATS:
        raise DataError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    lengths = {"seq": max_seq_length, "pred": max_predictions_per_seq}
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, (dtype, kind) in FORMATS[fmt].items():
        out[name] = (dtype, () if kind is None else (int(lengths[kind] or 0),))
    return out


@dataclass(frozen=True, kw_only=True)
class ShardRecord:
    """One shard file and how many samples it holds."""

    file: str
    """File name, relative to the data directory."""
    num_samples: int
    """Samples in this file."""


@dataclass(frozen=True, kw_only=True)
class DatasetMetadata:
    """What ``metadata.json`` records about a converted data set."""

    format: str
    """``mlm_nsp`` or ``causal_lm``."""
    max_seq_length: int
    """Tokens per sample (MSL)."""
    max_predictions_per_seq: int | None
    """Masked positions per sample (``mlm_nsp``); None for ``causal_lm``."""
    masked_lm_prob: float | None
    """Fraction of tokens masked (``mlm_nsp``)."""
    short_seq_prob: float | None
    """Probability of a shorter target length (``mlm_nsp``)."""
    dupe_factor: int
    """Passes over the input (each with different masks / pairs)."""
    vocab_file: str
    """The vocabulary, relative to the data directory (``vocab.txt``)."""
    vocab_size: int
    """Tokens in the vocabulary: the model's ``vocab_size``."""
    special_token_ids: dict[str, int]
    """Ids of ``[PAD]``, ``[UNK]``, ``[CLS]``, ``[SEP]``, ``[MASK]``."""
    tokenizer: dict[str, Any]
    """How text became ids: library and version, type, lowercase, trained or from which vocab file."""
    seed: int
    """The converter's random seed (pairs and masks)."""
    samples_per_shard: int
    """Samples per shard file (the last may hold fewer)."""
    total_samples: int
    """Samples in all shards."""
    num_documents: int
    """Documents read from the input."""
    inputs: list[str]
    """The input files, as given after glob expansion."""
    shards: list[ShardRecord]
    """The shard files, in sample order."""
    fields: dict[str, dict[str, Any]]
    """Per field: ``dtype`` and per-sample ``shape``."""
    csrun_version: str
    """The csrun that wrote the data."""
    metadata_version: int = 1
    """Version of this record's layout."""

    def to_json(self) -> str:
        """The record as pretty JSON text."""
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


def read_metadata(data_dir: str | Path) -> DatasetMetadata:
    """Read and check ``<data_dir>/metadata.json``; :class:`DataError` naming the path when unusable."""
    root = Path(data_dir)
    if not root.is_dir():
        raise DataError(f"data_dir {str(root)!r} is not a directory")
    path = root / METADATA_FILE
    if not path.is_file():
        raise DataError(f"no {METADATA_FILE} in data_dir {str(root)!r}: is it a directory written "
                        "by cs_convert_hdf5 (an interrupted conversion leaves none)?")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"cannot read {str(path)!r}: {exc}") from None
    try:
        shards = [ShardRecord(**s) for s in raw.pop("shards")]
        meta = DatasetMetadata(shards=shards, **raw)
    except (TypeError, KeyError, AttributeError) as exc:
        raise DataError(f"{str(path)!r} is not a csrun data record: {exc}") from None
    if meta.format not in FORMATS:
        raise DataError(f"{str(path)!r} names format {meta.format!r}; this csrun reads "
                        f"{', '.join(FORMATS)}")
    check_record(meta, path)
    if sum(s.num_samples for s in meta.shards) != meta.total_samples:
        raise DataError(f"{str(path)!r} is inconsistent: shard sizes do not add up to total_samples "
                        f"{meta.total_samples}")
    for shard in meta.shards:
        if not (root / shard.file).is_file():
            raise DataError(f"shard {str(root / shard.file)!r} listed in {METADATA_FILE} is missing")
    return meta


MAX_SEQ_LENGTH = 1 << 20
"""The longest ``max_seq_length`` a record may state (tokens per sample)."""
MAX_SAMPLES = 1 << 40
"""The most samples a record may state (per shard, and in all)."""


def _count(path: Path, name: str, value: Any, least: int, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise DataError(f"{str(path)!r}: {name} is {value!r}; it must be an integer from {least} to {most}")
    return value


def check_record(meta: DatasetMetadata, path: Path) -> None:
    """Every number of the record within its bounds, shard names inside the folder, and the fields
    exactly the format's (names, dtypes, per-sample shapes): :class:`DataError` naming the field
    and value. Nothing is allocated from the record before this passes."""
    msl = _count(path, "max_seq_length", meta.max_seq_length, 1, MAX_SEQ_LENGTH)
    mps = meta.max_predictions_per_seq
    if mps is not None:
        _count(path, "max_predictions_per_seq", mps, 0, msl)
    _count(path, "total_samples", meta.total_samples, 0, MAX_SAMPLES)
    _count(path, "vocab_size", meta.vocab_size, 1, 2**31 - 1)
    for i, shard in enumerate(meta.shards):
        _count(path, f"shards[{i}].num_samples", shard.num_samples, 0, MAX_SAMPLES)
        file = Path(str(shard.file))
        if not isinstance(shard.file, str) or file.is_absolute() or ".." in file.parts or len(file.parts) != 1:
            raise DataError(f"{str(path)!r}: shards[{i}].file is {shard.file!r}; it must be a file name in the "
                            f"data directory")
    expected = metadata_fields(meta.format, msl, mps)
    if not isinstance(meta.fields, dict) or set(meta.fields) != set(expected):
        names = sorted(meta.fields) if isinstance(meta.fields, dict) else meta.fields
        raise DataError(f"{str(path)!r}: fields are {names!r}; format {meta.format} has {sorted(expected)}")
    for name, want in expected.items():
        got = meta.fields[name]
        if not isinstance(got, dict) or got.get("dtype") != want["dtype"] or list(got.get("shape", [])) != want["shape"]:
            raise DataError(f"{str(path)!r}: field {name} is {got!r}; format {meta.format} stores it as "
                            f"{want['dtype']} of per-sample shape {want['shape']}")


def value_ranges(meta: DatasetMetadata) -> dict[str, tuple[float, float, str]]:
    """Per field of the record's format: ``(least, greatest, what the values are)``, the range every
    stored value must be in before it reaches a model (an id past the vocabulary would index past
    an embedding; a label of -7 would reach a loss kernel)."""
    ids = (0, meta.vocab_size - 1, f"token ids of the data's {meta.vocab_size}-token vocabulary")
    flag = (0, 1, "0 or 1")
    ranges = {"input_ids": ids, "labels": ids, "masked_lm_ids": ids, "attention_mask": flag, "token_type_ids": flag,
              "next_sentence_label": flag, "masked_lm_weights": (0.0, 1.0, "weights from 0 to 1"),
              "masked_lm_positions": (0, meta.max_seq_length - 1,
                                      f"positions in a sequence of {meta.max_seq_length} tokens")}
    return {name: ranges[name] for name in FORMATS[meta.format]}


def metadata_fields(fmt: str, max_seq_length: int, max_predictions_per_seq: int | None) -> dict[str, dict[str, Any]]:
    """The ``fields`` entry of the record for a format and sizes."""
    return {name: {"dtype": dtype, "shape": list(shape)}
            for name, (dtype, shape) in field_shapes(fmt, max_seq_length, max_predictions_per_seq).items()}


__all__ = ["METADATA_FILE", "VOCAB_FILE", "SHARD_PATTERN", "SPECIAL_TOKENS", "FORMATS", "field_shapes",
           "ShardRecord", "DatasetMetadata", "read_metadata", "metadata_fields", "check_record", "MAX_SEQ_LENGTH",
           "MAX_SAMPLES", "value_ranges"]
