"""Fixtures for the data tests: a tiny generated corpus, converted data sets, an id-numbered data set."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from csrun.cli.cs_convert_hdf5 import main as convert_main

WORDS = ("the cat dog sat on mat ran fast slow big small red blue tree house river walked jumped "
         "over under near green bird sang loud quiet").split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[str]]]:
    """A text file of 14 documents (one sentence per line, blank lines between) and its documents."""
    rng = random.Random(7)
    docs = [[" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + " ."
             for _ in range(rng.randint(2, 6))] for _ in range(14)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    return path, docs


def _convert(out: Path, *args: str) -> Path:
    code = convert_main([*args, "--output_dir", str(out), "--quiet"])
    if code != 0:
        raise RuntimeError(f"conversion failed with exit code {code}")
    return out


@pytest.fixture(scope="session")
def convert() -> Callable[..., Path]:
    """Run the converter in-process: ``convert(out_dir, *flags)``."""
    return _convert


@pytest.fixture(scope="session")
def mlm_dir(corpus: tuple[Path, list[list[str]]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlm_nsp data with a tokenizer trained on the corpus."""
    return _convert(tmp_path_factory.mktemp("mlm") / "out", "--input", str(corpus[0]), "--format", "mlm_nsp",
                    "--max_seq_length", "24", "--max_predictions_per_seq", "4", "--samples_per_shard", "16",
                    "--vocab_size", "60", "--dupe_factor", "3", "--seed", "3")


@pytest.fixture(scope="session")
def vocab_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT-style vocab.txt holding the specials, every corpus word and '.'."""
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join([*SPECIALS, ".", *sorted(set(WORDS))]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def ids_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Path]:
    """``ids_dir(n)``: a causal_lm data set of n samples (shards of 10) where ``input_ids[i, 0] == i``."""
    from csrun.data.formats import DatasetMetadata, METADATA_FILE, field_shapes, metadata_fields
    from csrun.data.hdf5_writer import ShardWriter, StagedOutput

    made: dict[int, Path] = {}

    def make(n: int) -> Path:
        if n in made:
            return made[n]
        out = tmp_path_factory.mktemp(f"ids{n}") / "data"
        with StagedOutput(out, overwrite=False) as staged:
            writer = ShardWriter(staged, fields=field_shapes("causal_lm", 4, None), samples_per_shard=10,
                                 attrs={"format": "causal_lm"})
            for i in range(n):
                row = np.array([i, 1, 2, 3], np.int32)
                writer.add({"input_ids": row, "attention_mask": np.ones(4, np.int32), "labels": row})
            records = writer.finish()
            meta = DatasetMetadata(format="causal_lm", max_seq_length=4, max_predictions_per_seq=None,
                                   masked_lm_prob=None, short_seq_prob=None, dupe_factor=1, vocab_file="vocab.txt",
                                   vocab_size=n + 4, special_token_ids={}, tokenizer={}, seed=0,
                                   samples_per_shard=10, total_samples=n, num_documents=1, inputs=[],
                                   shards=records, fields=metadata_fields("causal_lm", 4, None),
                                   csrun_version="test")
            staged.path(METADATA_FILE).write_text(meta.to_json(), encoding="utf-8")
            staged.commit()
        made[n] = out
        return out

    return make
