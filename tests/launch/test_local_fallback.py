"""Without Slurm (no srun on PATH) both launchers say so and run here with the same contract."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, PROBE, read_probes


def run(argv: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def test_csrun_cpu_runs_locally(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    done = run([str(BIN / "csrun_cpu"), str(BIN / "python-pt"), str(PROBE), str(tmp_path)], no_slurm_env)
    assert done.returncode == 0, done.stderr
    assert "csrun_cpu: no Slurm here (srun not found on PATH); running the command locally." in done.stdout
    probes = read_probes(tmp_path)
    assert list(probes) == [0]
    rec = probes[0]
    assert (rec["role"], rec["num_tasks"], rec["launcher"], rec["launch_mode"]) == ("chief", 1, "csrun_cpu", "local")
    assert rec["env"]["CSRUN_GRES_NODE"] == "cs-chief" and rec["env"]["CSRUN_TOTAL_TASKS"] == "1"


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "options, tasks",
    [(["--total-nodes", "1", "--tasks-per-node", "2"], 2), (["--total-nodes", "3", "--tasks-per-node", "2"], 6), (["--total-nodes", "4", "--single-task-nodes", "2", "--tasks-per-node", "2", "--cyclic"], 6)],
)
def test_csrun_wse_runs_the_layout_under_mpiexec(no_slurm_env: dict[str, str], tmp_path: Path, options: list[str], tasks: int) -> None:
    env = {**no_slurm_env, "CS_IP": "10.0.0.5:9000"}
    done = run([str(BIN / "csrun_wse"), "--mount-dirs", "/data", *options, str(BIN / "python-pt"), str(PROBE), str(tmp_path)], env)
    assert done.returncode == 0, done.stderr
    assert f"running the {tasks} tasks locally under mpiexec" in done.stdout
    assert f"mpiexec -n {tasks} " in done.stdout
    probes = read_probes(tmp_path)
    assert sorted(probes) == list(range(tasks))
    assert [p["role"] for _, p in sorted(probes.items())] == ["chief"] + ["streamer"] * (tasks - 1)
    for rank, rec in probes.items():
        assert rec["mpi_rank"] == rank and rec["mpi_size"] == tasks and rec["allreduce"] == tasks
        assert (rec["launcher"], rec["launch_mode"], rec["num_tasks"]) == ("csrun_wse", "local", tasks)
        assert rec["env"]["CS_IP"] == "10.0.0.5:9000" and rec["env"]["CSRUN_MOUNT_DIRS"] == "/data"


@pytest.mark.timeout(120)
def test_a_failing_task_ends_the_local_job_within_seconds(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    """python-pt runs multi-task scripts under mpi4py's runner: a rank's non-zero exit aborts the job."""
    start = time.monotonic()
    done = run([str(BIN / "csrun_wse"), "--total-nodes", "2", "--tasks-per-node", "2", str(BIN / "python-pt"), str(PROBE), str(tmp_path), "--fail-rank", "2", "--sleep", "90"], no_slurm_env, timeout=100)
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert elapsed < 30, f"the job took {elapsed:.0f}s to end after a task failed"
