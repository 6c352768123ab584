"""Ctrl-C at csrun_wse does the same locally (mpiexec) and under Slurm (srun) (issue 33 item 5).

The first Ctrl-C (SIGINT to csrun_wse, as a terminal sends it) asks the job to save a
checkpoint at its next step and stop: one line says so, the chief saves, nothing reads as a
failure (no traceback, no task named, no MPICH banner), the job exits 130 and ``--resume`` continues from that checkpoint. A second Ctrl-C
stops it at once: the job ends within seconds with 130 and nothing of it keeps running.
Before, Slurm's srun ignored a single Ctrl-C (the run went on to the end and exited 0) and
locally one Ctrl-C in four printed a traceback and nothing was saved.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO, follow, long_debug_params
from tests.launch.stopping import FAILURE_WORDS

pytestmark = pytest.mark.timeout(300)
END_WITHIN_S = 10.0
SLOW_SAVE = Path(__file__).parent / "scripts" / "slow_save_task.py"
COMMAND = [str(BIN / "csrun_wse"), "--total-nodes", "3", str(BIN / "python-pt"), str(REPO / "models" / "fc_mnist" / "run.py"),
           "--mode", "train"]


def interrupted(env: dict[str, str], tmp_path: Path) -> tuple[int, str, float, Path, dict, Path]:
    """fc_mnist under csrun_wse, SIGINTed once the chief logs a step: the exit code, the output, the
    seconds from the SIGINT to the end, the model_dir and the params (doc, file)."""
    params_doc, params = long_debug_params(tmp_path)
    md = tmp_path / "md"
    md.mkdir()
    sent_at: list[float] = []

    def on_line(line: str, proc: subprocess.Popen[str]) -> None:
        if not sent_at and "| Train: step" in line:
            os.kill(proc.pid, signal.SIGINT)
            sent_at.append(time.monotonic())

    code, output = follow([*COMMAND, "--params", str(params), "-o", str(md)], env, on_line, cwd=tmp_path)
    return code, output, time.monotonic() - sent_at[0] if sent_at else -1.0, md, params_doc, params


def still_running(model_dir: Path, grace_s: float = 5.0) -> list[str]:
    """The command lines of processes naming ``model_dir`` (a job's leftovers) still there after
    ``grace_s`` (a Slurm step's tasks may take a moment to be torn down after srun ends)."""
    deadline = time.monotonic() + grace_s
    while True:
        out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
        left = [line for line in out.splitlines() if str(model_dir) in line]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.fixture(params=["local", "slurm"])
def launch_env(request: pytest.FixtureRequest, no_slurm_env: dict[str, str]) -> dict[str, str]:
    if request.param == "local":
        return {**no_slurm_env, "OMP_NUM_THREADS": "1"}
    return {**request.getfixturevalue("slurm_env"), "OMP_NUM_THREADS": "1"}


def test_one_ctrl_c_saves_and_stops_and_resume_continues(launch_env: dict[str, str], tmp_path: Path) -> None:
    code, output, took, md, params_doc, params = interrupted(launch_env, tmp_path)
    assert code == 130, output[-3000:]
    assert "csrun_wse: interrupted: the job stops (a training run.py saves a checkpoint at its next step first)" in output, \
        output[-3000:]
    for words in FAILURE_WORDS:  # a planned stop: csrun's lines only (was: MPICH's BAD TERMINATION banner, Abort(130))
        assert words not in output, f"{words!r} in:\n{output[-3000:]}"
    saved = sorted(md.glob("checkpoint_*.mdl"))
    assert len(saved) == 1, output[-3000:]
    assert "checkpoint saved. Continue with --resume." in output
    assert took < END_WITHIN_S and not still_running(md)
    step = int(saved[0].stem.split("_")[1])
    params_doc["runconfig"]["max_steps"] = step + 10
    params.write_text(__import__("yaml").safe_dump(params_doc))
    again = subprocess.run([*COMMAND, "--params", str(params), "-o", str(md), "--resume"], env=launch_env,
                           capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert (md / f"checkpoint_{step + 10}.mdl").exists(), sorted(p.name for p in md.iterdir())


def test_a_second_ctrl_c_stops_at_once(launch_env: dict[str, str], tmp_path: Path) -> None:
    """The job is still saving when the second press comes (tests/launch/scripts/slow_save_task.py;
    a real fc_mnist may be done within the half second between two presses)."""
    ready: list[str] = []
    sent_at: list[float] = []

    def on_line(line: str, proc: subprocess.Popen[str]) -> None:
        if line.rstrip().endswith(" ready"):  # "rank 0 ready", "[rank 1] rank 1 ready"
            ready.append(line)
        if len(ready) == 3 and not sent_at:  # every task's handler is in place
            os.kill(proc.pid, signal.SIGINT)
            sent_at.append(time.monotonic())
        elif " saving" in line and len(sent_at) == 1:  # the first press reached a task: still saving
            os.kill(proc.pid, signal.SIGINT)
            sent_at.append(time.monotonic())

    command = [str(BIN / "csrun_wse"), "--total-nodes", "3", str(BIN / "python-pt"), str(SLOW_SAVE), str(tmp_path)]
    code, output = follow(command, launch_env, on_line, cwd=tmp_path)
    assert len(sent_at) == 2 and code == 130, output[-3000:]
    took = time.monotonic() - sent_at[-1]
    assert "csrun_wse: interrupted: the job stops" in output and "csrun_wse: interrupted again: stopping the job now" in output, \
        output[-3000:]
    assert took < END_WITHIN_S, f"{took:.1f} s"
    assert not still_running(tmp_path)


def test_the_jobs_own_emulator_ignores_the_preemption_signals() -> None:
    """csrun_wse --emulator: Ctrl-C sends the step's group the preemption signal; the job's cs_emulator
    is in that group and must outlive it, or the chief could not fetch the weights it saves."""
    from csrun.launch.job_emulator import _server_preexec

    child = subprocess.Popen(["sleep", "30"], preexec_fn=_server_preexec)
    try:
        ignored = int(next(line.split()[1] for line in Path(f"/proc/{child.pid}/status").read_text().splitlines()
                           if line.startswith("SigIgn:")), 16)
        assert ignored & (1 << (signal.SIGUSR1 - 1)) and ignored & (1 << (signal.SIGUSR2 - 1))
    finally:
        child.kill()
        child.wait()
