"""Waiting for a child while signals arrive: csrun.launch.process.wait_child and its two users.

The kernel hands a process-directed signal to any thread that does not block it. A wrapper
whose main thread sleeps in a blocking ``wait()`` does not run the handler of a signal that
went to one of its other threads (the task log's pumps) until the child has ended: a
preemption signal forwarded by the task wrapper, or submitit's, was lost that way (seen in CI
on a loaded machine). These tests give the signal to a helper thread on purpose
(``pthread_kill``), in a separate interpreter so pytest's own signal state is left alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from csrun.launch.process import wait_child
from tests.conftest import REPO, base_env

CHILD = """
import pathlib, signal, sys, time
signal.signal(signal.SIGUSR1, lambda *_: sys.exit({code}))
pathlib.Path({ready!r}).touch()
time.sleep(20)
"""
"""A child that exits with ``code`` on SIGUSR1 once it has said it is ready, else after 20 s with 0."""

NUDGE = """
import signal, threading, time
from pathlib import Path

def nudge(sig):
    def run():
        while not Path({ready!r}).exists():
            time.sleep(0.02)
        time.sleep(0.2)  # the main thread is in its wait by now
        signal.pthread_kill(threading.get_ident(), sig)  # to this thread, not to the waiting one
    threading.Thread(target=run, daemon=True).start()
"""


def run_script(body: str, tmp_path: Path) -> str:
    ready = str(tmp_path / "ready")
    child = CHILD.format(code=42, ready=ready)
    script = NUDGE.format(ready=ready) + textwrap.dedent(body).format(child=child)
    done = subprocess.run([sys.executable, "-c", script], env=base_env(), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_run_child_forwards_a_signal_that_another_thread_took(tmp_path: Path) -> None:
    """The task wrapper's wait: SIGUSR1 given to a helper thread still reaches the child at once."""
    out = run_script("""
        import os, signal, sys
        from csrun.launch.process import run_child
        nudge(signal.SIGUSR1)
        print(run_child([sys.executable, "-c", {child!r}], dict(os.environ)))
    """, tmp_path)
    assert out == "42"  # a blocking wait() forwards only after the child's 20 s: exit code 0


def test_command_job_checkpoints_when_the_preemption_signal_went_to_another_thread(tmp_path: Path) -> None:
    """submitit's handler (here: one calling checkpoint) runs during CommandJob's wait and may wait for the child itself."""
    out = run_script("""
        import os, signal, sys
        from csrun.launch.sbatch import CommandJob
        job = CommandJob()
        command = [sys.executable, "-c", {child!r}.replace("exit(42)", "exit(138)")]

        def on_preemption(signum, frame):
            print(type(job.checkpoint(command, dict(os.environ), os.getcwd())).__name__)
            sys.exit(0)

        signal.signal(signal.SIGUSR2, on_preemption)
        nudge(signal.SIGUSR2)
        print("ended", job(command, dict(os.environ), os.getcwd()))
    """, tmp_path)
    assert out == "DelayedSubmission"  # 138 = 128 + SIGUSR1: the command checkpointed and asked to run again


def test_wait_child_returns_the_code_and_restores_the_wakeup_fd() -> None:
    """Exit codes as Popen gives them (negative for a signal); a wake-up fd set before is back afterwards."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    before = signal.set_wakeup_fd(write_end)
    try:
        assert wait_child(subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"])) == 5
        assert wait_child(subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])) == -signal.SIGTERM
    finally:
        assert signal.set_wakeup_fd(before) == write_end
        os.close(read_end)
        os.close(write_end)


def test_wait_child_off_the_main_thread() -> None:
    """Off the main thread (no wake-up fd there) it polls, and still returns the child's code."""
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(wait_child(subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]))))
    thread.start()
    thread.join(30)
    assert codes == [3]
