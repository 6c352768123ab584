"""Preemption on the real cluster: SIGUSR1 -> checkpoint -> scontrol requeue -> the next run resumes.

csrun_wse --use-sbatch submits a heterogeneous batch job that asks for SIGUSR1 before its
time limit; csrun_cpu --use-sbatch goes through submitit, which asks for SIGUSR2. The tests
send that signal themselves (as Slurm would at the time limit minus the lead), let the
requeued job start at once, and check that the second run resumed from the preemption
checkpoint and finished the training.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, REPO, long_debug_params

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1800)]  # generous: the cluster is shared and busy
WAIT = 600
"""Seconds a test waits for a condition: a deadline only a hang reaches."""


def squeue_state(job: str, env: dict[str, str], field: str = "%T") -> str:
    """The job's state (or another squeue ``field``, ``%r``: the reason it waits)."""
    out = subprocess.run(["squeue", "--noheader", "--states=all", f"--format={field}", f"--jobs={job}"], env=env, capture_output=True, text=True).stdout.split()
    return out[0] if out else ""


def wait_until(predicate, seconds: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def finished(job: str, env: dict[str, str]) -> bool:
    """Whether the job completed (an end in another state fails the test at once, naming it)."""
    state = squeue_state(job, env)
    assert state not in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY"), \
        f"job {job} ended {state}: {squeue_state(job, env, '%r')}"
    return state == "COMPLETED"


def finish_after_requeue(job: str, env: dict[str, str], md: Path, params: dict, params_file: Path) -> int:
    """Wait for the requeue, check the preemption checkpoint, shorten the run, start it now, wait."""
    wait_until(lambda: squeue_state(job, env) in ("PENDING", "REQUEUED", "REQUEUE_HOLD"), WAIT, "the job to be requeued")
    wait_until(lambda: len(list(md.glob("checkpoint_*.mdl"))) == 1, WAIT, "the preemption checkpoint")
    saved_step = int(re.findall(r"\d+", next(md.glob("checkpoint_*.mdl")).name)[0])
    assert 0 < saved_step < 100000
    params["runconfig"]["max_steps"] = saved_step + 50
    params_file.write_text(yaml.safe_dump(params))
    # Slurm's BeginTime delay exists so the first run is cleaned up (its credential revoked) first: the
    # requeued job is started once it waits for nothing but that delay
    wait_until(lambda: (squeue_state(job, env), squeue_state(job, env, "%r")) == ("PENDING", "BeginTime")
               or squeue_state(job, env) in ("RUNNING", "COMPLETED"), WAIT, "the requeued job to wait for its begin time")
    # not "now": slurmd refuses a launch whose credential is of the same second as the revocation of the
    # first run's ("Job credential revoked", the job FAILED); two seconds on, it is of a later one
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now+2"], env=env, check=False)
    wait_until(lambda: finished(job, env), WAIT, "the requeued run to finish")
    return saved_step


def test_csrun_cpu_use_sbatch_checkpoints_requeues_and_resumes(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """submitit's preemption signal (USR2) -> the command checkpoints (USR1) -> requeue -> resume."""
    params, params_file = long_debug_params(tmp_path)
    md, logs = tmp_path / "md", tmp_path / "logs"
    env = {**slurm_env, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(BIN / "csrun_cpu"), "--use-sbatch", "--log-dir", str(logs), "--time", "30", str(BIN / "python-pt"),
                           str(REPO / "models" / "fc_mnist" / "run.py"), "--mode", "train", "--params", str(params_file), "-o", str(md)],
                          env=env, capture_output=True, text=True, timeout=WAIT, cwd=REPO)
    assert done.returncode == 0, done.stderr
    job = done.stdout.split()[3].rstrip(";")
    try:
        out = lambda: "".join(p.read_text() for p in (logs / job).glob("*_log.out"))  # noqa: E731
        wait_until(lambda: "Train: step" in out(), WAIT, "training to start")
        subprocess.run(["scancel", "--signal=USR2", job], env=env, check=True)
        saved_step = finish_after_requeue(job, env, md, params, params_file)
    finally:
        subprocess.run(["scancel", job], env=env, check=False)
    text = out()
    assert "requeued by Slurm (restart 1)" in text and "Training Completed Successfully!" in text
    assert (md / f"checkpoint_{saved_step + 50}.mdl").exists()


def test_csrun_wse_use_sbatch_checkpoints_requeues_and_resumes(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """The heterogeneous batch job's SIGUSR1 (sent as Slurm would before the limit) -> checkpoint -> requeue -> resume."""
    params, params_file = long_debug_params(tmp_path)
    md, logs = tmp_path / "md", tmp_path / "logs"
    env = {**slurm_env, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(BIN / "csrun_wse"), "--use-sbatch", "--log-dir", str(logs), "--time", "30", "--preempt-lead", "60",
                           "--total-nodes", "2", "--tasks-per-node", "1", str(BIN / "python-pt"), str(REPO / "models" / "fc_mnist" / "run.py"),
                           "--mode", "train", "--params", str(params_file), "-o", str(md)], env=env, capture_output=True, text=True, timeout=WAIT, cwd=REPO)
    assert done.returncode == 0, done.stderr
    job = done.stdout.split()[3].rstrip(";")
    log = logs / job / f"{job}_log.out"
    try:
        wait_until(lambda: log.exists() and "Train: step" in log.read_text(), WAIT, "training to gain a step")
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=env, check=True)
        saved_step = finish_after_requeue(job, env, md, params, params_file)
    finally:
        subprocess.run(["scancel", job], env=env, check=False)
    text = log.read_text()
    assert "requeueing job" in (logs / job / f"{job}_log.err").read_text()
    assert "requeued by Slurm (restart 1)" in text and "Training Completed Successfully!" in text
    assert (md / f"checkpoint_{saved_step + 50}.mdl").exists()
