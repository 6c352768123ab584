"""fc_mnist on the embedded emulator (the device path) through run(): same weights as the CPU,
exact resume, compile_only / validate_only stop after the compile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from tests.run.conftest import DEBUG_YAML, write_yaml
from tests.run.test_train import PERFORMANCE_KEYS, assert_same_weights

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
    perf = json.loads((dev / "performance" / "performance.json").read_text())
    assert PERFORMANCE_KEYS <= perf.keys() and perf["path"] == "system"
    assert perf["compile_time"] is not None and perf["est_samples_per_sec"] > 0
    assert list(dev.glob("cs_*/plan.json"))


@pytest.mark.parametrize("flag,message", [("--compile_only", "Compile for training completed successfully!"),
                                          ("--validate_only", "Validation completed successfully!")])
def test_compile_and_validate_only_stop_after_the_compile(fc_mnist: Run, tmp_path: Path, flag: str, message: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(tmp_path / "md"), flag) == 0
    out = capsys.readouterr().out
    assert message in out and "Training Completed Successfully!" not in out
    assert not list((tmp_path / "md").glob("*.mdl"))
