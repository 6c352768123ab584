"""The preemption signal and the requeue decision of csrun_wse --use-sbatch's batch script.

The script's body runs here under bash with a stand-in ``scontrol`` (it only records its
arguments): the requeue decision is the script's own logic, not Slurm's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from csrun.errors import ConfigError
from csrun.launch.hetjob import PREEMPTION_BODY, TASK_CODES, hetjob_script
from csrun.launch.layout import wse_layout
from csrun.launch.preempt_signal import max_idle_requeues, preemption_signal, submitit_signal
from csrun.site import SiteConfig

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("value,sig", [("", signal.SIGUSR1), ("USR2", signal.SIGUSR2), ("sigusr2", signal.SIGUSR2),
                                       ("TERM", signal.SIGTERM)])
def test_preemption_signal(value: str, sig: signal.Signals) -> None:
    assert preemption_signal({"CSRUN_PREEMPT_SIGNAL": value}) == sig


@pytest.mark.parametrize("value", ["KILL", "INT", "9", "usr3"])
def test_a_bad_preemption_signal_names_it(value: str) -> None:
    with pytest.raises(ConfigError, match=f"^CSRUN_PREEMPT_SIGNAL: '{value}' is not a preemption signal: USR1, USR2 or TERM \\("):
        preemption_signal({"CSRUN_PREEMPT_SIGNAL": value})


def test_submitit_signal_and_the_idle_cap() -> None:
    assert submitit_signal({}) == signal.SIGUSR2 and submitit_signal({"SUBMITIT_PREEMPT_SIGNAL": "USR1"}) == signal.SIGUSR1
    assert max_idle_requeues({}) == 3 and max_idle_requeues({"CSRUN_MAX_IDLE_REQUEUES": "5"}) == 5
    with pytest.raises(ConfigError, match="^CSRUN_MAX_IDLE_REQUEUES: '0' must be at least 1 \\(preemptions in a row"):
        max_idle_requeues({"CSRUN_MAX_IDLE_REQUEUES": "0"})


def test_the_batch_script_asks_for_the_configured_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CSRUN_PREEMPT_SIGNAL", "USR2")
    layout = wse_layout(nodes=2, tasks_per_node=1, cpus_per_task=1, single_task_nodes=0, cyclic=False)
    script = hetjob_script(["python", "run.py"], layout, SiteConfig(gres_node="n0", gres_resource="cs:1"),
                           job_name="j", log_dir=Path("/logs"), time="60", cwd="/w", preempt_lead=90)
    assert "#SBATCH --signal=B:USR2@90" in script and "trap on_preempt USR2" in script
    assert 'kill -USR2 "$step"' in script and "USR1" not in script


RUNNER_LIKE = """
import os, signal, sys, time
def stop(signum, frame):
    open(os.environ["CSRUN_REQUEUE_FILE"], "w").write("42\\n")  # as csrun.run.preemption.ask_to_requeue
    sys.exit(128 + signum)
signal.signal(signal.SIGUSR1, stop)
open(sys.argv[1], "w").write("ready")
time.sleep(30)
"""

KILLED_BY_IT = """
import sys, time
open(sys.argv[1], "w").write("ready")
time.sleep(30)  # no handler: SIGUSR1 kills it, exit code 138 as well
"""


@pytest.mark.parametrize("step,requeued", [(RUNNER_LIKE, True), (KILLED_BY_IT, False)])
def test_the_script_requeues_only_a_run_that_asked(tmp_path: Path, step: str, requeued: bool) -> None:
    bin_dir, logs, ready = tmp_path / "bin", tmp_path / "logs", tmp_path / "ready"
    bin_dir.mkdir()
    (logs / "77").mkdir(parents=True)
    calls = tmp_path / "scontrol.calls"
    fake = bin_dir / "scontrol"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    fake.chmod(0o755)
    (tmp_path / "step.py").write_text(step)
    body = TASK_CODES.format(log_dir=str(logs), python=sys.executable) + PREEMPTION_BODY.format(
        step=f"{sys.executable} {tmp_path / 'step.py'} {ready}", sig="USR1", log_dir=str(logs))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77"}
    env.pop("SLURM_RESTART_COUNT", None)
    proc = subprocess.Popen(["bash", "-c", body], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)  # as Slurm's --signal=B:USR1 would
    out, err = proc.communicate(timeout=30)
    if requeued:
        assert proc.returncode == 0 and calls.read_text() == "requeue 77\n", err
        assert "requeueing job 77 to resume from its checkpoint (global step 42)" in err
        assert not (logs / "77" / ".requeue.0").exists()
    else:
        assert proc.returncode == 138 and not calls.exists()
        assert "not requeueing job 77: the step (exit code 138) did not report a preemption checkpoint" in err
