"""Text → tokenized HDF5 shards: the work behind ``cs_convert_hdf5`` (its module doc is the manual).

:func:`convert` checks every setting and the output directory before reading anything, reads
the documents, loads or trains the WordPiece tokenizer, builds the samples of the chosen
format, and writes shards, ``vocab.txt`` and ``metadata.json`` through a staged output: on
any error nothing is left behind and an existing data set is untouched.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

import csrun
from csrun.data.causal import causal_lm_samples
from csrun.data.errors import DataError
from csrun.data.formats import (FORMATS, METADATA_FILE, VOCAB_FILE, DatasetMetadata, field_shapes,
                                metadata_fields)
from csrun.data.hdf5_writer import ShardWriter, StagedOutput, check_output_dir
from csrun.data.mlm import MlmSettings, mlm_nsp_samples
from csrun.data.text import expand_inputs, read_documents
from csrun.data.tokenizer import WordPiece, load_wordpiece, train_wordpiece

MIN_SEQ_LENGTH = {"mlm_nsp": 5, "causal_lm": 2}
"""Smallest max_seq_length per format (mlm_nsp: [CLS] a [SEP] b [SEP])."""
MIN_TRAINED_VOCAB = 16
"""Smallest --vocab_size for a trained tokenizer."""


@dataclass(frozen=True, kw_only=True)
class ConvertConfig:
    """Every setting of one conversion (the converter's flags, same names)."""

    inputs: tuple[str, ...]
    """Text files or globs."""
    output_dir: Path
    """Where the shards, vocab.txt and metadata.json go."""
    format: str = "mlm_nsp"
    """``mlm_nsp`` or ``causal_lm``."""
    max_seq_length: int = 128
    """Tokens per sample."""
    max_predictions_per_seq: int = 20
    """Masked positions per sample (mlm_nsp)."""
    masked_lm_prob: float = 0.15
    """Fraction of tokens masked (mlm_nsp)."""
    short_seq_prob: float = 0.1
    """Probability of a shorter sample (mlm_nsp)."""
    dupe_factor: int = 1
    """Passes over the input, each masked differently (mlm_nsp)."""
    samples_per_shard: int = 1024
    """Samples per shard file."""
    vocab_file: Path | None = None
    """A WordPiece vocab.txt; None trains one on the input."""
    vocab_size: int = 30522
    """Largest vocabulary when training one."""
    min_frequency: int = 1
    """Fewest occurrences for a trained token to be merged in."""
    lowercase: bool = True
    """Lowercase and strip accents (uncased BERT)."""
    seed: int = 12345
    """Seed of pairs and masks."""
    overwrite: bool = False
    """Replace the data set in a non-empty output directory."""

    def validate(self) -> None:
        """Raise :class:`DataError` naming the first bad setting."""
        if self.format not in FORMATS:
            raise DataError(f"--format {self.format!r} is not one of {', '.join(FORMATS)}")
        least = MIN_SEQ_LENGTH[self.format]
        if self.max_seq_length < least:
            raise DataError(f"--max_seq_length {self.max_seq_length} is too small for {self.format}: "
                            f"it needs at least {least}")
        if self.samples_per_shard < 1:
            raise DataError(f"--samples_per_shard must be at least 1, got {self.samples_per_shard}")
        if self.format == "mlm_nsp":
            if not 1 <= self.max_predictions_per_seq <= self.max_seq_length - 3:
                raise DataError(f"--max_predictions_per_seq {self.max_predictions_per_seq} must be in "
                                f"1..{self.max_seq_length - 3} (max_seq_length - 3)")
            if not 0.0 < self.masked_lm_prob <= 1.0:
                raise DataError(f"--masked_lm_prob {self.masked_lm_prob} must be in (0, 1]")
            if not 0.0 <= self.short_seq_prob <= 1.0:
                raise DataError(f"--short_seq_prob {self.short_seq_prob} must be in [0, 1]")
            if self.dupe_factor < 1:
                raise DataError(f"--dupe_factor must be at least 1, got {self.dupe_factor}")
        if self.vocab_file is None and self.vocab_size < MIN_TRAINED_VOCAB:
            raise DataError(f"--vocab_size {self.vocab_size} is too small to train a tokenizer: "
                            f"use at least {MIN_TRAINED_VOCAB}")
        if self.min_frequency < 1:
            raise DataError(f"--min_frequency must be at least 1, got {self.min_frequency}")


def convert(config: ConvertConfig, *, log: Callable[[str], None] = lambda line: None) -> DatasetMetadata:
    """Run one conversion; the metadata written. :class:`DataError` on bad input, nothing written."""
    config.validate()
    check_output_dir(config.output_dir, overwrite=config.overwrite)
    paths = expand_inputs(config.inputs)
    tokenizer: WordPiece | None = None
    if config.vocab_file is not None:
        tokenizer = load_wordpiece(config.vocab_file, lowercase=config.lowercase)
    raw_documents = read_documents(paths)
    log(f"read {len(raw_documents)} documents from {len(paths)} file(s)")
    if tokenizer is None:
        tokenizer = train_wordpiece(paths, vocab_size=config.vocab_size, lowercase=config.lowercase,
                                    min_frequency=config.min_frequency)
        log(f"trained a WordPiece vocabulary of {tokenizer.vocab_size} tokens")
    documents = _tokenize(tokenizer, raw_documents)
    if config.format == "mlm_nsp" and len(documents) < 2:
        raise DataError(f"mlm_nsp needs at least 2 documents (separated by blank lines) for its random "
                        f"next sentences; --input holds {len(documents)}")
    with StagedOutput(config.output_dir, overwrite=config.overwrite) as out:
        fields = field_shapes(config.format, config.max_seq_length, _predictions(config))
        writer = ShardWriter(out, fields=fields, samples_per_shard=config.samples_per_shard,
                             attrs={"format": config.format, "csrun_version": csrun.__version__,
                                    "max_seq_length": config.max_seq_length})
        for sample in _samples(config, tokenizer, documents):
            writer.add(sample)
        records = writer.finish()
        if not records:
            raise DataError(f"--input produced no {config.format} samples")
        if config.vocab_file is not None:
            shutil.copyfile(config.vocab_file, out.path(VOCAB_FILE))
        else:
            out.path(VOCAB_FILE).write_text("\n".join(tokenizer.vocab_lines()) + "\n", encoding="utf-8")
        meta = DatasetMetadata(
            format=config.format, max_seq_length=config.max_seq_length,
            max_predictions_per_seq=_predictions(config),
            masked_lm_prob=config.masked_lm_prob if config.format == "mlm_nsp" else None,
            short_seq_prob=config.short_seq_prob if config.format == "mlm_nsp" else None,
            dupe_factor=config.dupe_factor if config.format == "mlm_nsp" else 1,
            vocab_file=VOCAB_FILE, vocab_size=tokenizer.vocab_size,
            special_token_ids=tokenizer.special_ids, tokenizer=tokenizer.describe(), seed=config.seed,
            samples_per_shard=config.samples_per_shard, total_samples=sum(r.num_samples for r in records),
            num_documents=len(documents), inputs=[str(p) for p in paths], shards=records,
            fields=metadata_fields(config.format, config.max_seq_length, _predictions(config)),
            csrun_version=csrun.__version__)
        out.path(METADATA_FILE).write_text(meta.to_json(), encoding="utf-8")
        out.commit()
    log(f"wrote {meta.total_samples} {config.format} samples in {len(records)} shard(s) to "
        f"{config.output_dir}")
    return meta


def _predictions(config: ConvertConfig) -> int | None:
    return config.max_predictions_per_seq if config.format == "mlm_nsp" else None


def _tokenize(tokenizer: WordPiece, documents: list[list[str]]) -> list[list[list[int]]]:
    out = []
    for doc in documents:
        sentences = [ids for ids in tokenizer.encode(doc) if ids]
        if sentences:
            out.append(sentences)
    if not out:
        raise DataError("--input holds no text that tokenizes to any token")
    return out


def _samples(config: ConvertConfig, tokenizer: WordPiece,
             documents: list[list[list[int]]]) -> Iterator[dict[str, np.ndarray]]:
    ids = tokenizer.special_ids
    if config.format == "causal_lm":
        return causal_lm_samples(documents, max_seq_length=config.max_seq_length, sep_id=ids["[SEP]"],
                                 pad_id=ids["[PAD]"])
    settings = MlmSettings(max_seq_length=config.max_seq_length,
                           max_predictions_per_seq=config.max_predictions_per_seq,
                           masked_lm_prob=config.masked_lm_prob, short_seq_prob=config.short_seq_prob,
                           dupe_factor=config.dupe_factor, vocab_size=tokenizer.vocab_size,
                           pad_id=ids["[PAD]"], cls_id=ids["[CLS]"], sep_id=ids["[SEP]"],
                           mask_id=ids["[MASK]"], special_ids=frozenset(ids.values()))
    return mlm_nsp_samples(documents, settings, random.Random(config.seed))
