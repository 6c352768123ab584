"""Hostile data folders: every field is checked against the record, and the record against the
format and sane bounds, before anything is allocated from them. Each bad folder gives one
DataError naming the file, the field and the bad value; a huge declared field is refused
without growing the process."""

from __future__ import annotations

import json
import resource
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np
import pytest

from csrun.data.errors import DataError
from csrun.data.formats import METADATA_FILE, field_shapes, metadata_fields
from csrun.data.hdf5_reader import ShardReader

MSL = 8


def good_folder(root: Path, samples: int = 4) -> Path:
    """A small causal_lm folder (one shard) whose record and shard agree."""
    root.mkdir(parents=True, exist_ok=True)
    with h5py.File(root / "shard_00000.h5", "w") as h5:
        for name, (dtype, shape) in field_shapes("causal_lm", MSL, None).items():
            h5.create_dataset(name, data=np.ones((samples, *shape), dtype=dtype))
    record = {"format": "causal_lm", "max_seq_length": MSL, "max_predictions_per_seq": None,
              "masked_lm_prob": None, "short_seq_prob": None, "dupe_factor": 1, "vocab_file": "vocab.txt",
              "vocab_size": 16, "special_token_ids": {}, "tokenizer": {}, "seed": 0, "samples_per_shard": samples,
              "total_samples": samples, "num_documents": 1, "inputs": [],
              "shards": [{"file": "shard_00000.h5", "num_samples": samples}],
              "fields": metadata_fields("causal_lm", MSL, None), "csrun_version": "test"}
    (root / METADATA_FILE).write_text(json.dumps(record))
    return root


def edit_record(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    record = json.loads((root / METADATA_FILE).read_text())
    change(record)
    (root / METADATA_FILE).write_text(json.dumps(record))


def edit_shard(root: Path, change: Callable[[h5py.File], None]) -> None:
    with h5py.File(root / "shard_00000.h5", "a") as h5:
        change(h5)


def _replace(h5: h5py.File, name: str, data: Any) -> None:
    del h5[name]
    h5.create_dataset(name, data=data)


CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("float64 token ids", lambda r: edit_shard(r, lambda h: _replace(h, "input_ids", np.ones((4, MSL)))),
     "field 'input_ids' is float64; the record says int32"),
    ("record says float64 ids", lambda r: edit_record(r, lambda d: d["fields"]["input_ids"].update(dtype="float64")),
     "field input_ids is"),
    ("wrong row count", lambda r: edit_shard(r, lambda h: _replace(h, "labels", np.ones((3, MSL), np.int32))),
     "field 'labels' has shape (3, 8); the record says (4, 8)"),
    ("missing field", lambda r: edit_shard(r, lambda h: h.__delitem__("attention_mask")),
     "no dataset 'attention_mask'"),
    ("a group, not a dataset", lambda r: edit_shard(r, lambda h: (h.__delitem__("labels"), h.create_group("labels"))),
     "'labels' is a Group"),
    ("external link", lambda r: edit_shard(r, lambda h: (h.__delitem__("labels"),
                                                        h.__setitem__("labels", h5py.ExternalLink("/etc/x.h5", "/d")))),
     "field 'labels' is a ExternalLink"),
    ("negative count", lambda r: edit_record(r, lambda d: d["shards"][0].update(num_samples=-4)),
     "shards[0].num_samples is -4"),
    ("count as text", lambda r: edit_record(r, lambda d: d.update(total_samples="4")), "total_samples is '4'"),
    ("huge max_seq_length", lambda r: edit_record(r, lambda d: d.update(max_seq_length=47 * 2**30)),
     "max_seq_length is 50465865728"),
    ("path traversal", lambda r: edit_record(r, lambda d: d["shards"][0].update(file="../../etc/passwd")),
     "shards[0].file is '../../etc/passwd'"),
    ("unknown field", lambda r: edit_record(r, lambda d: d["fields"].update(extra={"dtype": "int32", "shape": []})),
     "fields are"),
]


@pytest.mark.parametrize("what, spoil, says", CASES, ids=[c[0] for c in CASES])
def test_a_bad_folder_is_one_line_naming_file_field_and_value(tmp_path: Path, what: str,
                                                              spoil: Callable[[Path], None], says: str) -> None:
    root = good_folder(tmp_path / "data")
    assert ShardReader(root).read(np.arange(4))["input_ids"].shape == (4, MSL)  # the unspoiled folder reads
    spoil(root)
    with pytest.raises(DataError) as exc:
        ShardReader(root).read(np.arange(4))
    assert says in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_a_field_declaring_billions_of_elements_allocates_nothing(tmp_path: Path) -> None:
    """The 47 x 2^30-element field grew a process to 24 GB: now it is refused before any read."""
    root = good_folder(tmp_path / "data")
    edit_shard(root, lambda h: (h.__delitem__("labels"),
                                h.create_dataset("labels", shape=(4, 47 * 2**30), dtype=np.int32)))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(DataError, match=r"field 'labels' has shape \(4, 50465865728\)"):
        ShardReader(root).read(np.arange(4))
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 200 * 1024  # far below the field's 756 GiB


def test_the_bundled_debug_data_passes_the_checks() -> None:
    folders = sorted(p.parent for p in Path(__file__).parents[2].glob("models/**/" + METADATA_FILE))
    assert folders
    for folder in folders:
        reader = ShardReader(folder)
        assert reader.read(np.arange(min(2, len(reader))))
