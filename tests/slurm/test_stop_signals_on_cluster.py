"""Every stop signal Slurm or a launcher sends ends a job on the real cluster with a checkpoint at the step reached (issue 45 items 3, 4).

The local side, and what the jobs run, is tests/launch/test_stop_signals.py. Here the signal
comes as it does on a cluster: to csrun_wse, which passes the preemption signal on through srun
(srun itself would end the step on SIGTERM); from ``scancel`` (SIGTERM to every process of every
step, SIGKILL after the cluster's KillWait: a cluster's systems and MemoryX must outlive the
SIGTERM until the chief has their state); from ``scancel --signal=USR1`` (Slurm's preemption
signal to every task). And a ``kill -9`` of csrun_wse leaves nothing running: srun gets SIGTERM
from its dying parent and ends the step, and the job's state folder goes at once.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.launch.stopping import FAILURE_WORDS, GONE_WITHIN_S, Job, check_planned_stop, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]
CANCELLED_WORDS = tuple(w for w in FAILURE_WORDS if not w.startswith("srun"))
"""What must not show after a scancel (srun's own lines about the step Slurm cancelled may)."""


@pytest.mark.parametrize("layout, how, code", [
    ("chief and streamers", "SIGTERM to csrun_wse", 128 + signal.SIGTERM),
    ("cluster", "scancel", 128 + signal.SIGTERM),
    ("chief and streamers", "scancel --signal=USR1", 128 + signal.SIGUSR1),
])
def test_a_stop_on_slurm_saves_and_stops(slurm_env: dict[str, str], tmp_path: Path, layout: str, how: str,
                                         code: int) -> None:
    with Job(slurm_env, tmp_path, layout, named=True) as job:
        job.wait_ready()
        if how == "SIGTERM to csrun_wse":
            job.proc.send_signal(signal.SIGTERM)
        else:
            subprocess.run([*how.split(), f"--name={job.mark}"], env=slurm_env, check=True, timeout=60)
        job.finish()
        check_planned_stop(job, code, failure_words=CANCELLED_WORDS if how == "scancel" else FAILURE_WORDS)


def test_kill_9_of_the_launcher_leaves_nothing_behind_on_slurm(slurm_env: dict[str, str], tmp_path: Path) -> None:
    with Job(slurm_env, tmp_path, "chief and streamers", named=True, save_s=60) as job:
        job.wait_ready()
        [state] = list(tmp_path.glob(".csrun_job.*"))
        job.proc.send_signal(signal.SIGKILL)
        job.proc.wait()
        assert wait_until(lambda: not job.processes(), GONE_WITHIN_S), job.processes()
        assert wait_until(lambda: not state.exists(), GONE_WITHIN_S), sorted(p.name for p in state.iterdir())

    def allocated() -> str:
        return subprocess.run(["squeue", "--noheader", f"--name={job.mark}", "--states=RUNNING,PENDING"], env=slurm_env,
                              capture_output=True, text=True, timeout=60).stdout.strip()

    assert wait_until(lambda: not allocated(), GONE_WITHIN_S), allocated()
