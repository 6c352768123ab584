"""Checkpoint files: weights-only round trip, atomic saves, checksum refusal, --resume fallback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from csrun import mdl
from csrun.errors import EnvironmentFailure
from csrun.run.checkpoints import CheckpointError, latest_valid, list_checkpoints, load_checkpoint, save_checkpoint


def state(v: float) -> dict:
    return {"model": {"w": torch.full((3, 3), v)}, "optimizer": {"state": {0: {"step": torch.tensor(1.0)}},
                                                               "param_groups": [{"lr": 0.1, "params": [0]}]},
            "lr_scheduler": {"global_step": 5}, "amp": {}, "global_step": 5, "data_position": 5}


def test_round_trip_is_weights_only_loadable(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, 5, state(1.0))
    assert path.name == "checkpoint_5.mdl"
    assert (tmp_path / "checkpoint_5.mdl.sha256").read_text().endswith("  checkpoint_5.mdl\n")
    torch.load(path, weights_only=True)  # plain torch can read it without unpickling code
    got = load_checkpoint(path)
    assert torch.equal(got["model"]["w"], torch.full((3, 3), 1.0)) and got["data_position"] == 5


def test_crash_mid_save_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_checkpoint(tmp_path, 10, state(1.0))

    def dying_save(obj: object, f: object) -> None:
        f.write(b"PK\x03\x04 half a zip")  # type: ignore[attr-defined]
        raise OSError("disk full")

    monkeypatch.setattr(mdl.torch, "save", dying_save)
    with pytest.raises(EnvironmentFailure, match="cannot save checkpoint .*checkpoint_20.mdl: disk full; earlier checkpoints are intact"):
        save_checkpoint(tmp_path, 20, state(2.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_10.mdl", "checkpoint_10.mdl.sha256"]
    found = latest_valid(tmp_path)
    assert found is not None and found.step == 10 and not found.skipped


def test_a_left_over_temp_file_is_not_a_checkpoint(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 10, state(1.0))
    (tmp_path / ".checkpoint_20.mdl.123.tmp").write_bytes(b"half")
    assert [s for s, _ in list_checkpoints(tmp_path)] == [10]


def test_corrupt_and_truncated_files_are_refused_naming_the_path(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, 3, state(1.0))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is corrupt or truncated"):
        load_checkpoint(path)
    path.write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(CheckpointError, match=str(path)):
        load_checkpoint(path)
    (tmp_path / "checkpoint_3.mdl.sha256").unlink()  # no checksum: the zip check refuses it
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is corrupt or truncated .*zip CRC"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="no such file"):
        load_checkpoint(tmp_path / "checkpoint_99.mdl")


def _flip_a_tensor_byte(path: Path) -> None:
    """Flip one byte inside the first tensor's stored data (not the archive's bookkeeping)."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if "/data/" in i.filename)
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26: info.header_offset + 30])
    data[info.header_offset + 30 + name_len + extra_len + 5] ^= 0x40
    path.write_bytes(bytes(data))


def test_without_its_checksum_file_a_flipped_tensor_bit_is_still_refused(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 4, state(1.0))
    newest = save_checkpoint(tmp_path, 8, state(2.0))
    for step in (4, 8):
        (tmp_path / f"checkpoint_{step}.mdl.sha256").unlink()
    assert torch.equal(load_checkpoint(newest)["model"]["w"], torch.full((3, 3), 2.0))  # intact: loads
    _flip_a_tensor_byte(newest)
    assert not torch.equal(torch.load(newest, weights_only=True)["model"]["w"], torch.full((3, 3), 2.0))
    with pytest.raises(CheckpointError, match=f"checkpoint {newest} is corrupt or truncated .*CRC-32"):
        load_checkpoint(newest)
    found = latest_valid(tmp_path)  # --resume falls back to the older, intact one
    assert found is not None and found.step == 4 and str(newest) in found.skipped[0]


def test_code_in_a_checkpoint_is_not_run(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple:
            return (print, ("pwned",))

    path = tmp_path / "checkpoint_1.mdl"
    torch.save({"model": Evil()}, path)
    with pytest.raises(CheckpointError, match="weights-only"):
        load_checkpoint(path)


def test_latest_valid_falls_back_past_a_corrupt_newest(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 100, state(1.0))
    newest = save_checkpoint(tmp_path, 200, state(2.0))
    newest.write_bytes(newest.read_bytes()[:100])
    found = latest_valid(tmp_path)
    assert found is not None and found.step == 100
    assert len(found.skipped) == 1 and str(newest) in found.skipped[0]
    (tmp_path / "checkpoint_100.mdl").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        latest_valid(tmp_path)
    assert latest_valid(tmp_path / "empty") is None
