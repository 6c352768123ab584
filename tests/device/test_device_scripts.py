"""Whole scripts: compile_only / a failing compile / an mpiexec job with streamers and the device."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)

SCRIPT = Path(__file__).parent / "scripts" / "train_mlp.py"
MPIEXEC = Path(sys.executable).parent / "mpiexec"


def run(tmp_path: Path, *args: str, tasks: int = 1, timeout: float = 80) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), str(tmp_path / "out.json"), "--model_dir", str(tmp_path / "md"), *args]
    if tasks > 1:
        cmd = [str(MPIEXEC), "-n", str(tasks), *cmd]
    env = {k: v for k, v in os.environ.items()
           if k not in ("PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "CS_IP", "CSRUN_LAUNCHER")}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=tmp_path)


@pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec in the venv")
def test_compile_only_exits_0_and_writes_the_compile_dir(tmp_path: Path) -> None:
    done = run(tmp_path, "--compile_only", tasks=2)  # the streamer is stopped and exits 0 too
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Compiling the model. This may take a few minutes." in done.stdout
    assert "Compile for training completed successfully!" in done.stdout
    dirs = list((tmp_path / "md").glob("cs_*"))
    assert len(dirs) == 1 and (dirs[0] / "plan.json").exists()
    assert not (tmp_path / "out.json").exists()  # stopped at the first batch


def test_compile_only_and_validate_only_together_are_refused(tmp_path: Path) -> None:
    done = run(tmp_path, "--compile_only", "--validate_only")
    assert done.returncode != 0
    assert "Please set one of compile_only and validate_only" in done.stderr


def test_item_inside_forward_fails_the_compile_naming_the_line(tmp_path: Path) -> None:
    line = next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if "ITEM-LINE" in text)
    done = run(tmp_path, "--compile_only", "--item_in_forward")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Compile failed" in done.stdout
    assert f"train_mlp.py:{line}:" in re.sub(r"\s+", "", done.stdout)  # .../train_mlp.py:N: what


@pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec in the venv")
def test_two_streamers_feed_the_embedded_device_and_the_loss_falls(tmp_path: Path) -> None:
    done = run(tmp_path, "--cs_ip", "embedded", "--steps", "30", tasks=3)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "out.json").read_text())
    losses = result["losses"]
    assert len(losses) == 30 and result["global_step"] == 30 and result["streamers"] == 2
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    assert result["compile_time"] > 0
