"""cs_convert_hdf5's refusals: exit 2, a message naming the value, no traceback, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from csrun.cli.cs_convert_hdf5 import main
from csrun.data import DataError
from csrun.data.hdf5_writer import StagedOutput

pytestmark = pytest.mark.timeout(60)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.fixture()
def text(tmp_path: Path) -> Path:
    path = tmp_path / "in.txt"
    path.write_text("the cat sat .\nthe dog ran .\n\nbig red tree .\nblue river .\n", encoding="utf-8")
    return path


def _cases(tmp: Path, text: Path) -> list[tuple[list[str], str]]:
    empty = tmp / "empty.txt"
    empty.write_text("\n\n   \n", encoding="utf-8")
    one_doc = tmp / "one.txt"
    one_doc.write_text("a single document .\nwith two lines .\n", encoding="utf-8")
    no_specials = tmp / "bad_vocab.txt"
    no_specials.write_text("the\ncat\n", encoding="utf-8")
    latin1 = tmp / "latin1.txt"
    latin1.write_bytes("caf\xe9\n".encode("latin-1"))
    t = str(text)
    return [
        (["--input", str(tmp / "missing.txt")], "'" + str(tmp / "missing.txt") + "': no such file"),
        (["--input", str(tmp / "nothing*.txt")], "matches no file"),
        (["--input", str(empty)], "holds no text"),
        (["--input", str(latin1)], "is not UTF-8 text"),
        (["--input", t, "--max_seq_length", "4"], "--max_seq_length 4 is too small for mlm_nsp: it needs at least 5"),
        (["--input", t, "--format", "causal_lm", "--max_seq_length", "1"], "--max_seq_length 1 is too small"),
        (["--input", t, "--max_seq_length", "16", "--max_predictions_per_seq", "14"], "--max_predictions_per_seq 14"),
        (["--input", t, "--masked_lm_prob", "1.5"], "--masked_lm_prob 1.5"),
        (["--input", t, "--samples_per_shard", "0"], "--samples_per_shard must be at least 1, got 0"),
        (["--input", t, "--vocab_size", "3"], "--vocab_size 3 is too small"),
        (["--input", t, "--vocab_file", str(tmp / "nope.txt")], "--vocab_file '" + str(tmp / "nope.txt") + "': no such file"),
        (["--input", t, "--vocab_file", str(no_specials)], "lacks the special token(s) [PAD], [UNK], [CLS], [SEP], [MASK]"),
        (["--input", str(one_doc)], "mlm_nsp needs at least 2 documents"),
        (["--input", t, "--format", "bert"], "invalid choice: 'bert'"),
        (["--input", t, "--max_seq_length", "abc"], "invalid int value: 'abc'"),
        (["--input", t, "--bogus"], "unrecognized arguments: --bogus"),
    ]


def test_every_refusal_exits_2_naming_the_value(tmp_path: Path, text: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    for i, (argv, needle) in enumerate(_cases(tmp_path, text)):
        out = tmp_path / f"out{i}"
        code, err = _run(capsys, *argv, "--output_dir", str(out))
        assert code == 2, (argv, err)
        assert err.startswith("cs_convert_hdf5: error: ") and needle in err, (argv, err)
        assert not out.exists(), f"{argv} left {out}"


def test_missing_required_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys)
    assert code == 2 and "--input" in err and "--output_dir" in err


def test_non_empty_output_dir_is_refused_and_kept(tmp_path: Path, text: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, err = _run(capsys, "--input", str(text), "--output_dir", str(out))
    assert code == 2 and f"--output_dir '{out}' is not empty" in err and "--overwrite" in err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, err = _run(capsys, "--input", str(text), "--output_dir", str(afile))
    assert code == 2 and "is not a directory" in err


def test_a_failure_while_writing_leaves_nothing(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    with pytest.raises(DataError):
        with StagedOutput(fresh, overwrite=False) as out:
            out.path("shard_00000.h5").write_bytes(b"partial")
            raise DataError("boom")
    assert not fresh.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "metadata.json").write_text("old")
    with pytest.raises(DataError):
        with StagedOutput(kept, overwrite=True) as out:
            out.path("metadata.json").write_text("new")
            raise DataError("boom")
    assert [p.name for p in kept.iterdir()] == ["metadata.json"] and (kept / "metadata.json").read_text() == "old"


def test_help_prints_the_manual(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--input", "--output_dir", "--format", "--max_seq_length", "--max_predictions_per_seq",
                 "--masked_lm_prob", "--samples_per_shard", "--vocab_file", "--vocab_size", "--lowercase",
                 "--seed", "--dupe_factor", "--overwrite", "Exit codes"):
        assert flag in out
