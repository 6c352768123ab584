"""Inside an allocation but outside a step (salloc -n 2, an sbatch body without srun), a plain
python is one task with a notice: it never waits for streamers that do not exist (issue 11)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1200)]  # generous: the cluster is shared and busy

SCRIPT = Path(__file__).resolve().parents[1] / "device" / "scripts" / "typical_loop.py"


def test_salloc_two_tasks_plain_python_runs_as_one_task(slurm_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = subprocess.run(["salloc", "-n", "2", sys.executable, str(SCRIPT), str(out), "--steps", "4",
                           "--model_dir", str(tmp_path / "md")],
                          env=slurm_env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "this allocation has 2 tasks" in done.stderr and "runs as one task" in done.stderr
    result = json.loads(out.read_text())
    assert result["streamers"] == 0 and len(result["losses"]) == 4


def test_sbatch_body_without_srun_runs_as_one_task(slurm_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    log = tmp_path / "job.log"
    done = subprocess.run(["sbatch", "-n", "4", "-W", "-o", str(log),
                           "--wrap", f"{sys.executable} {SCRIPT} {out} --steps 3 --model_dir {tmp_path / 'md'}"],
                          env=slurm_env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr + log.read_text()
    assert "this allocation has 4 tasks" in log.read_text()
    assert json.loads(out.read_text())["streamers"] == 0
