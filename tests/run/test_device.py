"""fc_mnist on the embedded emulator (the device path) through run(): same weights as the CPU,
exact resume, compile_only / validate_only stop after the compile."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Callable

import pytest
import yaml

from csrun.run.checkpoints import load_checkpoint
from csrun.run.summaries import read_losses
from tests.run.conftest import DEBUG_YAML, PERFORMANCE_KEYS, assert_same_weights, diverging_yaml, write_yaml

Run = Callable[..., int]


def test_exact_resume_on_the_embedded_emulator_matches_the_cpu(fc_mnist: Run, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    cpu, dev = tmp_path / "cpu", tmp_path / "dev"
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(cpu)) == 0
    half = write_yaml(tmp_path / "half.yaml", max_steps=100)
    assert fc_mnist("-p", str(half), "-m", "train", "-o", str(dev), "--cs_ip", "embedded") == 0
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(dev), "--cs_ip", "embedded", "--resume") == 0
    out = capsys.readouterr().out
    assert "Compile for training completed successfully!" in out and "Training Completed Successfully!" in out
    assert_same_weights(cpu / "checkpoint_200.mdl", dev / "checkpoint_200.mdl")  # float32: bit-identical
    assert read_losses(dev) == read_losses(cpu)  # save_losses: every step's row, from the async loss closures too
    assert [s for s, _ in read_losses(dev)] == list(range(1, 201))
    perf = json.loads((dev / "performance" / "performance.json").read_text())
    assert PERFORMANCE_KEYS <= perf.keys() and perf["path"] == "system"
    assert perf["compile_time"] is not None and perf["est_samples_per_sec"] > 0
    assert list(dev.glob("cs_*/plan.json"))


def test_every_checkpoint_resumes_bit_identically_on_one_system(fc_mnist: Run, tmp_path: Path) -> None:
    """Batches of 287: an epoch of the digits is 5 of them. A checkpoint every step of 6, the epoch's last
    and the next epoch's first included: resumed from each, the run trains what the uninterrupted one did,
    bit for bit (one system takes every batch: the data position is the step; the cluster's case, with an
    epoch's tail left out, is tests/run/test_cluster_training.py's)."""
    data = yaml.safe_load(DEBUG_YAML.read_text())
    data["train_input"]["batch_size"] = 287
    data["runconfig"].update(max_steps=6, checkpoint_steps=1)
    config = tmp_path / "every_step.yaml"
    config.write_text(yaml.safe_dump(data))
    whole = tmp_path / "whole"
    assert fc_mnist("-p", str(config), "-m", "train", "-o", str(whole), "--cs_ip", "embedded") == 0
    assert [load_checkpoint(whole / f"checkpoint_{s}.mdl")["data_position"] for s in range(1, 7)] == [1, 2, 3, 4, 5, 6]
    for step in range(1, 6):
        parts = tmp_path / f"from_{step}"  # the run that stopped at `step`, its compile folder kept
        parts.mkdir()
        for kept in (*whole.glob("cs_*"), whole / f"checkpoint_{step}.mdl", whole / f"checkpoint_{step}.mdl.sha256"):
            (shutil.copytree if kept.is_dir() else shutil.copy2)(kept, parts / kept.name)
        assert fc_mnist("-p", str(config), "-m", "train", "-o", str(parts), "--cs_ip", "embedded", "--resume") == 0
        assert read_losses(parts) == read_losses(whole)[step:], step  # bitwise
        assert_same_weights(parts / "checkpoint_6.mdl", whole / "checkpoint_6.mdl")


@pytest.mark.parametrize("flag,message", [("--compile_only", "Compile for training completed successfully!"),
                                          ("--validate_only", "Validation completed successfully!")])
def test_compile_and_validate_only_stop_after_the_compile(fc_mnist: Run, tmp_path: Path, flag: str, message: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(tmp_path / "md"), flag) == 0
    out = capsys.readouterr().out
    assert message in out and "Training Completed Successfully!" not in out
    assert not list((tmp_path / "md").glob("*.mdl"))


def test_a_nan_loss_read_by_the_async_loss_closure_stops_the_job(fc_mnist: Run, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """With save_losses and no log or checkpoint step near, the loss is checked on the closure
    thread: the job still stops with the legacy message, exit 1, and writes no checkpoint."""
    p = diverging_yaml(tmp_path / "nan.yaml", checkpoint_steps=0, log_steps=1000, save_losses=True)
    md = tmp_path / "md"
    assert fc_mnist("-p", str(p), "-m", "train", "-o", str(md), "--cs_ip", "embedded") == 1
    err = capsys.readouterr().err
    assert "error: NaN loss detected.\n" in err or "error: inf loss detected.\n" in err
    assert "Traceback" not in err
    assert not list(md.glob("*.mdl"))
    rows = read_losses(md)
    assert [s for s, _ in rows] == list(range(1, len(rows) + 1)) and len(rows) < 200
    assert all(math.isfinite(v) for _, v in rows)  # the bad step's loss is not written
