"""Every stop signal, at csrun_wse or at the tasks, ends a local (mpiexec) job with a checkpoint at the step reached (issue 45 items 3, 4, 8).

The jobs run tests/launch/scripts/stop_task.py (the runner's own signal handling, save and
planned stop around a counter; a cluster's systems and MemoryX are the real swarm tasks, which
the chief asks for an answer as it saves). Before: a SIGTERM to csrun_wse killed MemoryX
(``task rank 3 (MemoryX) ... exited with code 143``) before the chief could save; SIGHUP and
SIGUSR2 killed mpiexec; a planned stop ended in MPICH's ``BAD TERMINATION`` banner or
``Abort(143) on node 0``; and after a ``kill -9`` of csrun_wse its tasks ran on for seconds
to minutes, its state folder until the next launch. The Slurm side is
tests/slurm/test_stop_signals_on_cluster.py; fc_mnist itself is stopped and resumed in
:func:`test_sigterm_to_a_cluster_job_saves_and_resume_continues`.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from csrun.launch.reaper import shm_names
from tests.conftest import BIN, REPO
from tests.launch.stopping import FAILURE_WORDS, GONE_WITHIN_S, Job, check_planned_stop, wait_until

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("layout, name", [
    ("lone chief", "SIGTERM"),
    ("chief and streamers", "SIGTERM"),
    ("chief and streamers", "SIGHUP"),
    ("chief and streamers", "SIGUSR2"),
])
def test_a_signal_to_the_launcher_saves_and_stops(no_slurm_env: dict[str, str], tmp_path: Path, layout: str,
                                                  name: str) -> None:
    """(Ctrl-C, and SIGUSR1, at the launcher: tests/launch/test_ctrl_c.py, test_local_preemption.py, with fc_mnist;
    SIGTERM at a cluster's: :func:`test_sigterm_to_a_cluster_job_saves_and_resume_continues`.)"""
    sig = signal.Signals[name]
    with Job(no_slurm_env, tmp_path, layout) as job:
        job.wait_ready()
        job.proc.send_signal(sig)
        job.finish()
        check_planned_stop(job, 128 + sig, said=f"csrun_wse: {name}: the job stops (a training run.py saves a checkpoint")
        assert job.saved()["signal"] == signal.SIGUSR1  # the step got the preemption signal, whatever the launcher got


def test_sigterm_to_every_task_of_a_cluster_saves_and_stops(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    """Every process of every task, as Slurm's scancel or a node's shutdown signals them: the systems
    and MemoryX outlive it until the chief has their state."""
    with Job(no_slurm_env, tmp_path, "cluster") as job:
        job.wait_ready()
        job.signal_tasks(signal.SIGTERM)
        job.finish()
        check_planned_stop(job, 128 + signal.SIGTERM)
        assert job.saved()["signal"] == signal.SIGTERM


@pytest.mark.parametrize("layout", ["chief and streamers", "cluster"])
def test_kill_9_of_the_launcher_leaves_nothing_behind(no_slurm_env: dict[str, str], tmp_path: Path, layout: str) -> None:
    """No process of the job within 5 s of the kill, and its state folder and MPICH segments removed
    at once (not by the next launch). The chief's save takes a minute: mpiexec, SIGTERMed as its
    parent dies, passes the signal on, and the tasks must not go on to save and stop by it."""
    with Job(no_slurm_env, tmp_path, layout, save_s=60) as job:
        job.wait_ready()
        [state] = list(tmp_path.glob("csrun_job.*"))
        made = job.segments()
        assert made, "the job maps no MPICH segment: the check below would hold of nothing"
        job.proc.send_signal(signal.SIGKILL)
        job.proc.wait()
        assert wait_until(lambda: not job.processes(), GONE_WITHIN_S), job.processes()
        assert wait_until(lambda: not state.exists(), GONE_WITHIN_S), sorted(p.name for p in state.iterdir())
        assert wait_until(lambda: not made & shm_names(), GONE_WITHIN_S), made & shm_names()


def test_sigterm_to_a_cluster_job_saves_and_resume_continues(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    """fc_mnist on two systems, MemoryX and a streamer: the issue's own case, end to end."""
    params = yaml.safe_load((REPO / "configs" / "fc_mnist_debug.yaml").read_text())
    params["runconfig"].update(max_steps=100000, checkpoint_steps=0, log_steps=20)
    params["train_input"]["batch_size"] = 64
    params_file, md = tmp_path / "long.yaml", tmp_path / "md"
    params_file.write_text(yaml.safe_dump(params))
    command = [str(BIN / "csrun_wse"), "--num-csx", "2", "--total-nodes", "5", sys.executable,
               str(REPO / "models" / "fc_mnist" / "run.py"), "--mode", "train", "--params", str(params_file), "-o", str(md),
               "--execution_strategy", "weight_streaming"]
    env = {**no_slurm_env, "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "output", "w") as log:
        launcher = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    output = lambda: (tmp_path / "output").read_text()  # noqa: E731
    try:
        assert wait_until(lambda: "| Train: step" in output() or launcher.poll() is not None, 240), output()[-3000:]
        launcher.send_signal(signal.SIGTERM)
        code = launcher.wait(120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    text = output()
    assert code == 143, text[-3000:]
    saved = [int(p.stem.split("_")[1]) for p in md.glob("checkpoint_*.mdl")]
    assert len(saved) == 1 and f"at global step {saved[0]}; checkpoint saved" in text, text[-3000:]
    for words in FAILURE_WORDS:  # was: csrun_wse: task rank 3 (MemoryX) on vm exited with code 143; ending the job
        assert words not in text, f"{words!r} in:\n{text[-3000:]}"
    params["runconfig"]["max_steps"] = saved[0] + 5
    params_file.write_text(yaml.safe_dump(params))
    again = subprocess.run([*command, "--resume"], env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert (md / f"checkpoint_{saved[0] + 5}.mdl").exists(), sorted(p.name for p in md.iterdir())
