"""Streaming from workers to the chief on the real cluster, launched by csrun_wse (srun --mpi=pmi2).

The same user script as tests/stream (every sample carries its index), so the chief's batch
sequence is checked against the sharding rule, across heterogeneous-step components.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN
from tests.stream.stream_helpers import SCRIPT, expected_sequence

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1200)]  # generous: the cluster is shared and busy


def stream(layout: list[str], out: Path, env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], dict[int, dict]]:
    """The job (its deadline is for a hang only: a job that ends, ended) and each task's record."""
    done = subprocess.run([str(BIN / "csrun_wse"), *layout, str(BIN / "python-pt"), str(SCRIPT), str(out), *args], env=env, capture_output=True, text=True, timeout=900)
    records = {int(f.stem[4:]): json.loads(f.read_text()) for f in out.glob("rank*.json")} if out.exists() else {}
    return done, records


def test_three_streamers_on_worker_nodes_exact_order(slurm_env: dict[str, str], tmp_path: Path) -> None:
    done, records = stream(["--total-nodes", "4", "--single-task-nodes", "1", "--tasks-per-node", "1"], tmp_path / "o", slurm_env, "--n", "24", "--epochs", "2", "--nested")
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(records) == [0, 1, 2, 3]
    assert records[0]["batches"] == expected_sequence(24, 2, 3, 24)
    assert records[0]["dtypes"]["idx"] == "torch.int64"
    assert [records[r]["task_id"] for r in (1, 2, 3)] == [0, 1, 2]


def test_skip_resumes_the_exact_sequence_under_slurm(slurm_env: dict[str, str], tmp_path: Path) -> None:
    done, records = stream(["--total-nodes", "2", "--tasks-per-node", "2"], tmp_path / "o", slurm_env, "--n", "12", "--epochs", "2", "--skip", "5")
    assert done.returncode == 0, done.stdout + done.stderr
    # 4 tasks: the chief and 3 streamers (one beside it on the GRES node, two on the worker node);
    # 6 batches an epoch: the first loop ends epoch 0 after the 5 skipped, the second is epoch 1
    assert records[0]["batches"] == expected_sequence(12, 2, 3, 7, skip=5)


def test_streamer_exception_ends_the_slurm_job_naming_the_rank(slurm_env: dict[str, str], tmp_path: Path) -> None:
    done, records = stream(["--total-nodes", "3", "--tasks-per-node", "1"], tmp_path / "o", slurm_env, "--n", "24", "--fail-at", "5")
    assert done.returncode != 0
    text = done.stdout + done.stderr
    node = records[2]["node"]  # where Slurm put it, as the task saw it
    assert f"csrun: error: streamer rank 2 (node {node})" in text and "ValueError: bad sample 5" in text, text[-3000:]


def test_killed_streamer_ends_the_slurm_job(slurm_env: dict[str, str], tmp_path: Path) -> None:
    done, _ = stream(["--total-nodes", "3", "--tasks-per-node", "1"], tmp_path / "o", {**slurm_env, "CSRUN_STREAM_TIMEOUT": "10"}, "--n", "24", "--kill-at", "5")
    assert done.returncode != 0
