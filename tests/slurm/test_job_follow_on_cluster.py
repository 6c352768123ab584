"""Following jobs on the real cluster (issue 34 item 6): job names in squeue, ``--use-sbatch
--wait`` streaming the chief's log and ending with the job's final state, ``csrun status`` /
``csrun logs`` for a job submitted without ``--wait``, an unknown job id."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO
from tests.slurm.nodes import gres_nodes

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1200)]  # generous: the cluster is shared and busy
WAIT = 600
"""Seconds a test waits for a condition (a job to start, a marker): a deadline only a hang reaches."""

FC_MNIST = [str(BIN / "python-pt"), str(REPO / "models" / "fc_mnist" / "run.py"), "--mode", "train",
            "--params", str(REPO / "configs" / "fc_mnist_debug.yaml"), "--max_steps", "20"]
"""A training run of a few seconds (20 steps of fc_mnist's debug twin)."""

NAMED_STEP = """\
import os, sys, time
from pathlib import Path
out = Path(sys.argv[1])
out.write_text(os.environ["SLURM_JOB_ID"])
deadline = time.monotonic() + 900  # until the test says stop (a test that died leaves no step behind for long)
while not (out.parent / "stop").exists() and time.monotonic() < deadline:
    time.sleep(0.2)
"""


def run(argv: list[str], env: dict[str, str], timeout: float = WAIT, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def job_id_of(stdout: str) -> str:
    first = stdout.splitlines()[0]
    assert first.startswith("Submitted batch job "), stdout
    return first.split()[3].rstrip(";")


def test_squeue_names_a_running_step_after_its_script(slurm_env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "named_step.py"
    script.write_text(NAMED_STEP)
    marker = tmp_path / "job_id"
    launcher = subprocess.Popen([str(BIN / "csrun_wse"), "--total-nodes", "1", "--tasks-per-node", "1", str(BIN / "python-pt"), str(script), str(marker)],
                                env=slurm_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + WAIT  # a job may wait for free nodes first
        while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.2)
        assert marker.exists(), launcher.communicate(timeout=30)
        names = run(["squeue", "--noheader", "--format=%j", f"--jobs={marker.read_text()}"], slurm_env).stdout.split()
        assert names and set(names) == {"csrun_wse:named_step.py"}, names
    finally:
        (tmp_path / "stop").touch()
        out, err = launcher.communicate(timeout=WAIT)
    assert launcher.returncode == 0, out + err
    assert "--job-name=csrun_wse:named_step.py" in out


def test_csrun_wse_use_sbatch_wait_streams_the_chiefs_log_and_ends_with_the_state(slurm_env: dict[str, str], tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = run([str(BIN / "csrun_wse"), "--use-sbatch", "--wait", "--log-dir", str(logs), "--total-nodes", "2", "--tasks-per-node", "1",
                *FC_MNIST, "-o", str(tmp_path / "md")], {**slurm_env, "OMP_NUM_THREADS": "1"}, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    job = job_id_of(done.stdout)
    lines = done.stdout.splitlines()
    assert any("Train: step 20/20" in line for line in lines), done.stdout
    assert any("Training Completed Successfully!" in line for line in lines)
    assert lines[-1] == f"csrun_wse: job {job} COMPLETED, exit code 0"
    assert "Train: step 20/20" in (logs / job / f"{job}_log.out").read_text(), "what was streamed is the job's log"


def test_csrun_cpu_use_sbatch_wait_streams_and_ends_with_the_commands_code(slurm_env: dict[str, str], tmp_path: Path) -> None:
    done = run([str(BIN / "csrun_cpu"), "--use-sbatch", "--wait", "--log-dir", str(tmp_path / "logs"),
                "bash", "-c", "echo from-the-batch-job; echo to-stderr >&2; exit 4"], slurm_env)
    assert done.returncode == 4, done.stdout + done.stderr
    job = job_id_of(done.stdout)
    assert "from-the-batch-job" in done.stdout and "to-stderr" in done.stderr
    assert done.stdout.splitlines()[-1] == f"csrun_cpu: job {job} COMPLETED, exit code 4"


def test_status_and_logs_follow_a_job_submitted_without_wait(slurm_env: dict[str, str], tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    env = {**slurm_env, "OMP_NUM_THREADS": "1"}
    done = run([str(BIN / "csrun_wse"), "--use-sbatch", "--log-dir", str(logs), "--total-nodes", "1", "--tasks-per-node", "1",
                *FC_MNIST, "-o", str(tmp_path / "md")], env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    job = job_id_of(done.stdout)
    try:
        assert f"csrun status {job}" in done.stdout and f"csrun logs {job} --follow" in done.stdout
        early = json.loads(run([str(BIN / "csrun"), "status", job, "--json"], env).stdout)
        assert early["name"] == "csrun_wse:run.py" and early["state"] in ("PENDING", "RUNNING", "COMPLETING", "COMPLETED")
        followed = run([str(BIN / "csrun"), "logs", job, "--follow"], env)
        assert followed.returncode == 0, followed.stdout + followed.stderr
        assert "Train: step 20/20" in followed.stdout
        assert followed.stdout.splitlines()[-1] == f"csrun: job {job} COMPLETED, exit code 0"
        status = run([str(BIN / "csrun"), "status", job], env)
        assert status.returncode == 0, status.stderr
        rows = dict(line.split(":", 1) for line in status.stdout.splitlines())
        assert {k: v.strip() for k, v in rows.items() if k in ("job", "name", "state", "exit code", "log folder")} == {
            "job": job, "name": "csrun_wse:run.py", "state": "COMPLETED", "exit code": "0", "log folder": str(logs / job)}
        assert rows["nodes"].strip() in gres_nodes(env)  # the chief's node, one with the GRES (Slurm's choice)
        assert rows["elapsed"].strip().count(":") == 2
        printed = run([str(BIN / "csrun"), "logs", job], env)
        assert printed.returncode == 0 and "Training Completed Successfully!" in printed.stdout
    finally:
        subprocess.run(["scancel", job], env=env, check=False)


def test_an_unknown_job_id_is_one_line_and_exit_1(slurm_env: dict[str, str]) -> None:
    for argv in (["status", "99999999"], ["logs", "99999999", "--follow"]):
        done = run([str(BIN / "csrun"), *argv], slurm_env)
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr.startswith("csrun: error: no job 99999999 known to Slurm") and done.stderr.count("\n") == 1, done.stderr
