"""The parts of a planned stop and of a launcher's death, one by one (the jobs are in test_stop_signals.py).

A planned stop (``stop.<rank>``: a run that saved and stopped when asked) is no failure, nor is
what ends after it; a failure before it still is. The batch script's rule says the same. A
task's wrapper ends its command when the process it watches (its launcher) ends. The state
folder's ``owner`` names its launcher so that a reused pid is not taken for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from csrun.launch.hetjob import TASK_CODES
from csrun.launch.owner import OWNER, Owner, read_owner, start_ticks, write_owner
from csrun.launch.process import wait_child
from csrun.task_exits import TaskWatch, planned_code
from tests.conftest import base_env


def write(folder: Path, name: str, line: str) -> None:
    (folder / name).write_text(line + "\n")


def first(folder: Path):  # type: ignore[no-untyped-def]
    watch = TaskWatch(str(folder))
    try:
        return watch.first_end(final=True), watch.first_failure(final=True)
    finally:
        watch.close()


def test_a_planned_stop_and_what_follows_it_are_no_failure(tmp_path: Path) -> None:
    write(tmp_path, "stop.0", "138 cs-chief 100.0 stopped by SIGUSR1 at global step 7")
    write(tmp_path, "exit.0", "138 cs-chief 100.5")
    write(tmp_path, "exit.1", "137 cs-w1 100.2")  # a streamer that went down as the chief saved
    write(tmp_path, "exit.2", "0 cs-w1 100.3")
    end, failure = first(tmp_path)
    assert failure is None
    assert end is not None and end.planned and (end.rank, end.code, end.at) == (0, 138, 100.0)
    assert planned_code(str(tmp_path), 0) == 138 and planned_code(str(tmp_path), 1) is None


def test_a_failure_before_the_stop_is_still_the_jobs(tmp_path: Path) -> None:
    write(tmp_path, "exit.3", "1 cs-w3 99.0 RuntimeError: lost")
    write(tmp_path, "stop.0", "143 cs-chief 100.0 stopped by SIGTERM at global step 7")
    write(tmp_path, "exit.0", "143 cs-chief 100.5")
    end, failure = first(tmp_path)
    assert failure is not None and (failure.rank, failure.code, failure.planned) == (3, 1, False) and end == failure


def test_a_stop_announced_then_broken_is_a_failure(tmp_path: Path) -> None:
    """The chief said it would exit 143 and exited 139 (it crashed on its way out)."""
    write(tmp_path, "stop.0", "143 cs-chief 100.0 stopped by SIGTERM at global step 7")
    write(tmp_path, "exit.0", "139 cs-chief 100.5")
    _, failure = first(tmp_path)
    assert failure is not None and failure.code == 139


def batch_rule(folder: Path) -> subprocess.CompletedProcess[str]:
    """The batch script's ``csrun_task_code 0`` over ``folder`` (csrun.launch.hetjob)."""
    script = TASK_CODES.format(log_dir="/unused", python=sys.executable) + f'CSRUN_JOB_STATE={folder}\ncsrun_task_code 0\n'
    script = script.replace('mkdir -p "$CSRUN_JOB_STATE"\n', "")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, env=base_env())


def test_the_batch_script_exits_with_a_planned_stops_code_naming_nobody(tmp_path: Path) -> None:
    stopped, failed = tmp_path / "stopped", tmp_path / "failed"
    for folder in (stopped, failed):
        folder.mkdir()
    write(stopped, "stop.0", "138 cs-chief 100.0 stopped by SIGUSR1 at global step 7")
    write(stopped, "exit.0", "138 cs-chief 100.5")
    write(failed, "exit.2", "6 cs-w2 100.5")
    done = batch_rule(stopped)
    assert (done.stdout, done.stderr) == ("138\n", "")
    done = batch_rule(failed)
    assert done.stdout == "6\n" and done.stderr == "csrun: task rank 2 on cs-w2 exited with code 6\n"


def test_the_owner_file_names_this_process_and_a_gone_one_is_not_taken_for_it(tmp_path: Path) -> None:
    write_owner(str(tmp_path))
    me = read_owner(tmp_path)
    assert me is not None and me.pid == os.getpid() and me.here and me.alive() and me.started == start_ticks(os.getpid())
    fd = me.open()
    assert fd is not None
    os.close(fd)
    reused = Owner(me.pid, me.host, me.namespace, str(int(me.started) - 1))  # the same pid, started at another time
    assert not reused.alive() and reused.open() is None
    (tmp_path / OWNER).write_text(f"{os.getpid()} {me.host}\n")  # an older launcher's two words
    assert read_owner(tmp_path) == Owner(os.getpid(), me.host)
    assert Owner(os.getpid(), "another-node").open() is None


def test_a_child_ends_when_the_watched_process_ends() -> None:
    watched = subprocess.Popen(["sleep", "0.5"])
    child = subprocess.Popen(["sleep", "60"])
    fd = os.pidfd_open(watched.pid)
    try:
        assert wait_child(child, until=fd) == -signal.SIGKILL
    finally:
        os.close(fd)
        watched.wait()
        if child.poll() is None:
            child.kill()
