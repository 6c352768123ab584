"""fc_mnist debug launched the legacy way on the local Slurm cluster (real srun, real MPI)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from csrun.run.summaries import read_losses
from tests.conftest import BIN, REPO
from tests.run.conftest import DEBUG_YAML

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1200)]  # generous: the cluster is shared and busy

RUN_PY = REPO / "models" / "fc_mnist" / "run.py"


def launch(launcher: list[str], env: dict[str, str], md: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*launcher, str(BIN / "python-pt"), str(RUN_PY), "--mode", "train", "--params",
                           str(DEBUG_YAML), "-o", str(md), *flags],
                          env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=900, cwd=REPO)


def assert_trained(done: subprocess.CompletedProcess[str], md: Path) -> list[tuple[int, float]]:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Training Completed Successfully!" in done.stdout
    losses = read_losses(md)
    assert [s for s, _ in losses] == list(range(1, 201))
    assert sum(l for _, l in losses[-20:]) < sum(l for _, l in losses[:20]) / 3  # the loss falls
    return losses


def test_csrun_cpu_runs_fc_mnist_debug(slurm_env: dict[str, str], tmp_path: Path) -> None:
    done = launch([str(BIN / "csrun_cpu"), "--alloc-node", "False"], slurm_env, tmp_path / "md")
    assert_trained(done, tmp_path / "md")
    assert json.loads((tmp_path / "md" / "performance" / "performance.json").read_text())["path"] == "cpu"


def test_csrun_wse_streams_to_the_embedded_emulator(slurm_env: dict[str, str], tmp_path: Path) -> None:
    md = tmp_path / "md"
    done = launch([str(BIN / "csrun_wse"), "--total-nodes", "3", "--tasks-per-node", "1"], slurm_env, md)
    assert "Compile for training completed successfully!" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert_trained(done, md)
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["path"] == "system" and len(perf["per_ordinal"]) == 2  # chief + 2 streamers on worker nodes
    assert sorted(o["ordinal"] for o in perf["per_ordinal"]) == [1, 2]
    assert sum(o["batches"] for o in perf["per_ordinal"]) >= 200  # they send ahead (prefetch)


def test_csrun_wse_emulator_server_trains_with_two_streamers(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """--emulator: a cs_emulator for the job on the chief's node; the chief trains through it over TCP."""
    md = tmp_path / "md"
    done = launch([str(BIN / "csrun_wse"), "--emulator", "--total-nodes", "3", "--tasks-per-node", "1"], slurm_env, md)
    assert "emulator for this job at 127.0.0.1:" in done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
    assert_trained(done, md)
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert perf["path"] == "system" and sorted(o["ordinal"] for o in perf["per_ordinal"]) == [1, 2]
    assert "cs_emulator: stopped" in done.stdout + done.stderr
