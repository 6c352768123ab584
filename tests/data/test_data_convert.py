"""cs_convert_hdf5 round trips: text -> shards -> samples that decode back to the text's tokens."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from tokenizers import BertWordPieceTokenizer

from csrun.data import HDF5Dataset, read_metadata

pytestmark = pytest.mark.timeout(60)

MLM_FIELDS = {"input_ids": torch.int64, "attention_mask": torch.int64, "token_type_ids": torch.int64,
              "masked_lm_positions": torch.int64, "masked_lm_ids": torch.int64,
              "masked_lm_weights": torch.float32, "next_sentence_label": torch.int64}


def _doc_streams(vocab: Path, docs: list[list[str]]) -> list[list[int]]:
    tok = BertWordPieceTokenizer(str(vocab), lowercase=True)
    return [[i for s in d for i in tok.encode(s, add_special_tokens=False).ids] for d in docs]


def _contains(stream: list[int], part: list[int]) -> bool:
    return f",{','.join(map(str, part))}," in f",{','.join(map(str, stream))},"


def _follows(stream: list[int], a: list[int], b: list[int]) -> bool:
    """B occurs after A in ``stream`` (truncation may have trimmed A's end or B's start)."""
    starts_a = [i for i in range(len(stream)) if stream[i:i + len(a)] == a]
    starts_b = [j for j in range(len(stream)) if stream[j:j + len(b)] == b]
    return any(j >= i + len(a) for i in starts_a for j in starts_b)


def _all(data_dir: Path) -> dict[str, torch.Tensor]:
    ds = HDF5Dataset(data_dir)
    return ds.read_batch(range(len(ds)))


def _check_mlm(data_dir: Path, docs: list[list[str]], L: int, P: int) -> dict[str, torch.Tensor]:
    meta = read_metadata(data_dir)
    vocab = (data_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    ids = meta.special_token_ids
    cls, sep, mask = ids["[CLS]"], ids["[SEP]"], ids["[MASK]"]
    streams = _doc_streams(data_dir / "vocab.txt", docs)
    b = _all(data_dir)
    n = meta.total_samples
    assert {k: v.dtype for k, v in b.items()} == MLM_FIELDS
    assert b["input_ids"].shape == (n, L) and b["masked_lm_positions"].shape == (n, P)
    assert b["next_sentence_label"].shape == (n,)
    assert set(b["next_sentence_label"].tolist()) == {0, 1}
    masked_somewhere = False
    for k in range(n):
        length = int(b["attention_mask"][k].sum())
        assert b["attention_mask"][k, :length].eq(1).all() and b["attention_mask"][k, length:].eq(0).all()
        tokens = b["input_ids"][k].clone()
        w = b["masked_lm_weights"][k]
        count = int(w.sum())
        assert count >= 1 and w[:count].eq(1).all() and w[count:].eq(0).all()
        pos = b["masked_lm_positions"][k, :count]
        assert pos.tolist() == sorted(set(pos.tolist())) and int(pos.max()) < length
        masked_somewhere |= bool(tokens[pos].eq(mask).any())
        tokens[pos] = b["masked_lm_ids"][k, :count]
        tokens = tokens[:length].tolist()
        seps = [i for i, t in enumerate(tokens) if t == sep]
        assert tokens[0] == cls and len(seps) == 2 and seps[1] == length - 1
        assert cls not in [tokens[p] for p in pos.tolist()] and sep not in [tokens[p] for p in pos.tolist()]
        types = b["token_type_ids"][k, :length].tolist()
        assert types == [0] * (seps[0] + 1) + [1] * (length - seps[0] - 1)
        a, bb = tokens[1:seps[0]], tokens[seps[0] + 1:-1]
        assert a and bb
        assert all(vocab[t] not in ("[CLS]", "[SEP]", "[PAD]", "[MASK]") for t in a + bb)
        assert any(_contains(s, a) for s in streams), f"sample {k}: A is not text from the corpus"
        assert any(_contains(s, bb) for s in streams), f"sample {k}: B is not text from the corpus"
        if int(b["next_sentence_label"][k]) == 0:
            assert any(_follows(s, a, bb) for s in streams), f"sample {k}: B does not follow A"
    assert masked_somewhere
    return b


def test_mlm_round_trip_with_trained_tokenizer(mlm_dir: Path, corpus) -> None:
    path, docs = corpus
    meta = read_metadata(mlm_dir)
    assert meta.format == "mlm_nsp" and meta.max_seq_length == 24 and meta.max_predictions_per_seq == 4
    assert meta.tokenizer["trained"] is True and meta.tokenizer["library"] == "tokenizers"
    assert meta.seed == 3 and meta.dupe_factor == 3 and meta.num_documents == 14
    assert meta.inputs == [str(path)] and meta.csrun_version
    vocab = (mlm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(vocab) == meta.vocab_size <= 60 and vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert [s.num_samples for s in meta.shards[:-1]] == [16] * (len(meta.shards) - 1)
    assert sum(s.num_samples for s in meta.shards) == meta.total_samples == len(HDF5Dataset(mlm_dir))
    with h5py.File(mlm_dir / meta.shards[0].file, "r") as f:
        assert f["input_ids"].dtype == np.int32 and f["masked_lm_weights"].dtype == np.float32
        assert f.attrs["format"] == "mlm_nsp"
    raw = json.loads((mlm_dir / "metadata.json").read_text())
    assert raw["fields"]["input_ids"] == {"dtype": "int32", "shape": [24]}
    _check_mlm(mlm_dir, docs, 24, 4)
    stored = HDF5Dataset(mlm_dir, int_dtype="stored")[0]
    assert stored["input_ids"].dtype == torch.int32 and stored["masked_lm_weights"].dtype == torch.float32


def test_mlm_with_vocab_file_decodes_to_words(corpus, vocab_file: Path, convert, tmp_path: Path) -> None:
    path, docs = corpus
    out = convert(tmp_path / "v", "--input", str(path), "--vocab_file", str(vocab_file),
                  "--max_seq_length", "20", "--max_predictions_per_seq", "3", "--seed", "5")
    meta = read_metadata(out)
    lines = vocab_file.read_text().splitlines()
    assert meta.vocab_size == len(lines) and meta.tokenizer["trained"] is False
    assert (out / "vocab.txt").read_text() == vocab_file.read_text()
    b = _check_mlm(out, docs, 20, 3)
    words = {w for d in docs for s in d for w in s.split()}
    restored = b["input_ids"].clone()
    for k in range(len(restored)):
        count = int(b["masked_lm_weights"][k].sum())
        restored[k, b["masked_lm_positions"][k, :count]] = b["masked_lm_ids"][k, :count]
    seen = {lines[t] for t in restored[b["attention_mask"].bool()].tolist()} - {"[CLS]", "[SEP]"}
    assert seen <= words and len(seen) > 10


def test_causal_lm_round_trip(corpus, vocab_file: Path, convert, tmp_path: Path) -> None:
    path, docs = corpus
    out = convert(tmp_path / "c", "--input", str(path), "--format", "causal_lm", "--vocab_file",
                  str(vocab_file), "--max_seq_length", "16", "--samples_per_shard", "7")
    meta = read_metadata(out)
    assert meta.format == "causal_lm" and meta.max_predictions_per_seq is None
    b = _all(out)
    assert set(b) == {"input_ids", "attention_mask", "labels"}
    assert all(t.dtype == torch.int64 and t.shape == (meta.total_samples, 16) for t in b.values())
    sep = meta.special_token_ids["[SEP]"]
    expected = [t for s in _doc_streams(vocab_file, docs) for t in [*s, sep]]
    stream: list[int] = []
    for k in range(meta.total_samples):
        m = b["attention_mask"][k].bool()
        inp, lab = b["input_ids"][k][m].tolist(), b["labels"][k][m].tolist()
        assert inp[1:] == lab[:-1]
        stream.extend(inp)
        if k < meta.total_samples - 1:
            assert m.all()
    stream.append(lab[-1])
    assert stream == expected


def test_same_seed_same_data_other_seed_other_masks(corpus, vocab_file: Path, convert, tmp_path: Path) -> None:
    flags = ["--input", str(corpus[0]), "--vocab_file", str(vocab_file), "--max_seq_length", "20",
             "--max_predictions_per_seq", "3"]
    one = _all(convert(tmp_path / "a", *flags, "--seed", "1"))
    two = _all(convert(tmp_path / "b", *flags, "--seed", "1"))
    other = _all(convert(tmp_path / "c", *flags, "--seed", "2"))
    assert all(torch.equal(one[k], two[k]) for k in one)
    assert one["input_ids"].shape != other["input_ids"].shape or not torch.equal(one["input_ids"], other["input_ids"])


def test_overwrite_replaces_the_data_set(corpus, vocab_file: Path, convert, tmp_path: Path) -> None:
    out = tmp_path / "o"
    convert(out, "--input", str(corpus[0]), "--vocab_file", str(vocab_file), "--format", "causal_lm",
            "--max_seq_length", "8", "--samples_per_shard", "5")
    before = len(read_metadata(out).shards)
    convert(out, "--input", str(corpus[0]), "--vocab_file", str(vocab_file), "--format", "causal_lm",
            "--max_seq_length", "8", "--samples_per_shard", "1000", "--overwrite")
    assert before > 1 and sorted(p.name for p in out.iterdir()) == ["metadata.json", "shard_00000.h5", "vocab.txt"]
    assert read_metadata(out).samples_per_shard == 1000
