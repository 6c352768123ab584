"""Every way a task can fail ends the whole csrun_wse job within seconds, with that task's code.

A three-task job (tests/launch/scripts/failing_task.py) fails where ``FAIL=RANK:PHASE:CODE``
says: before MPI init, inside initialize (a bad CSRUN_GC_FREEZE the task set itself), inside
Session entry (a bad CSRUN_STREAM_TIMEOUT, the same), mid-stream on a
streamer, mid-step on the chief, in an exit hook. Local mode (mpiexec) here; the same under
Slurm in tests/slurm/test_job_failures_on_cluster.py. Also: a SIGKILLed csrun_wse takes its
tasks (and a job's emulator) along, and an aborted job leaves no MPICH segment in /dev/shm.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import BIN

SCRIPT = Path(__file__).parent / "scripts" / "failing_task.py"
END_WITHIN_S = 10.0
pytestmark = pytest.mark.timeout(120)


def job(env: dict[str, str], *options: str) -> list[str]:
    return [str(BIN / "csrun_wse"), "--total-nodes", "3", *options, sys.executable, str(SCRIPT)]


MARK = "JOB_FAILURES_TEST_MARK"
"""Set, to a value of its own, in the environment of each test's job: its launcher, tasks and emulator
inherit it, so a test looks at (and cleans up) its own processes only, never another job's or another
checkout's running beside it on a shared machine."""


@pytest.fixture()
def mark() -> str:
    """This test's mark (:data:`MARK`)."""
    return uuid.uuid4().hex


def leftovers(mark: str) -> list[str]:
    """``pid args`` of this test's processes still running: the ones whose environment holds ``mark``."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if f"{MARK}={mark}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                found.append(f"{entry.name} {args}")
        except OSError:
            continue
    return found


def shm() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("mpich_shm_*")}


def in_use() -> set[str]:
    """The MPICH segments a live process maps (another job running beside this test, say)."""
    used: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        used.update(m.rsplit("/", 1)[-1].split()[0] for m in text.splitlines() if "/dev/shm/mpich_shm_" in m)
    return used


def left_behind(before: set[str]) -> set[str]:
    """New segments no live process maps: the ones the job left."""
    return shm() - before - in_use()


@pytest.mark.parametrize("fail, extra_env, code, rank", [
    ("1:before:7", {}, 7, 1),            # a streamer exits before MPI init
    ("0:before:5", {}, 5, 0),            # the chief exits before MPI init
    ("-1:none:0", {"SET_ENV": "session:CSRUN_STREAM_TIMEOUT=abc"}, 1, 0),  # inside Session entry
    ("-1:none:0", {"SET_ENV": "initialize:CSRUN_GC_FREEZE=maybe"}, 1, 0),  # inside initialize, before MPI init
    ("1:stream:9", {}, 9, 1),            # a streamer dies mid-stream
    ("0:step:3", {}, 3, 0),              # the chief exits mid-step
    ("2:atexit:4", {}, 4, 2),            # a streamer's exit hook fails after its work
])
def test_a_failed_task_ends_the_job_with_its_code(no_slurm_env: dict[str, str], fail: str, extra_env: dict[str, str],
                                                  code: int, rank: int, mark: str) -> None:
    before = shm()
    t0 = time.monotonic()
    done = subprocess.run(job(no_slurm_env), env={**no_slurm_env, "FAIL": fail, MARK: mark, **extra_env},
                          capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert done.returncode == code, done.stdout + done.stderr
    assert f"csrun_wse: task rank {rank} on " in done.stderr and f"exited with code {code}" in done.stderr, done.stderr
    assert took < END_WITHIN_S + 15, f"{took:.1f} s"  # the start-up of three torch tasks included (a loaded CI machine)
    assert not leftovers(mark)
    assert not left_behind(before), "the job left MPICH segments in /dev/shm"


def test_a_bad_knob_in_the_launchers_environment_starts_no_task(no_slurm_env: dict[str, str], mark: str) -> None:
    done = subprocess.run(job(no_slurm_env), env={**no_slurm_env, "CSRUN_GC_FREEZE": "maybe", MARK: mark},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "csrun_wse: error: CSRUN_GC_FREEZE: 'maybe' is not yes or no (1/0, true/false, yes/no, on/off) (a Session freezes the heap built before it "
        "out of the garbage collector's scans; default on; unset it for the default)"]
    assert "starting" not in done.stdout and not leftovers(mark)


def test_a_job_that_succeeds_exits_0(no_slurm_env: dict[str, str]) -> None:
    done = subprocess.run(job(no_slurm_env), env={**no_slurm_env, "FAIL": "-1:none:0"}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "rank 0 done" in done.stdout and "exited with code" not in done.stderr


def test_kill_9_of_csrun_wse_takes_the_jobs_emulator_along(no_slurm_env: dict[str, str], tmp_path: Path, mark: str) -> None:
    """(Without --emulator, and with a cluster's tasks: tests/launch/test_stop_signals.py.)"""
    log = tmp_path / "out.txt"
    with log.open("w") as out:
        proc = subprocess.Popen(job(no_slurm_env, "--emulator"),
                                env={**no_slurm_env, "FAIL": "-1:none:0", "STEP_SLEEP": "0.5", MARK: mark},
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "STEPPING" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert leftovers(mark)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        while leftovers(mark) and time.monotonic() - t0 < END_WITHIN_S:
            time.sleep(0.2)
        assert not leftovers(mark), leftovers(mark)
    finally:
        if proc.poll() is None:
            proc.kill()
        for line in leftovers(mark):  # this test's own only
            os.kill(int(line.split()[0]), signal.SIGKILL)


def test_without_csrun_wse_a_task_waiting_in_mpi_init_gives_up(no_slurm_env: dict[str, str]) -> None:
    """Under a plain mpiexec (no supervisor), the task whose peer never joins MPI ends after
    CSRUN_MPI_INIT_TIMEOUT with one line, instead of waiting forever."""
    t0 = time.monotonic()
    done = subprocess.run([str(Path(sys.executable).parent / "mpiexec"), "-n", "3", sys.executable, str(SCRIPT)],
                          env={**no_slurm_env, "FAIL": "1:before:7", "CSRUN_MPI_INIT_TIMEOUT": "3"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "MPI_Init did not complete within 3 s" in done.stdout + done.stderr
    assert time.monotonic() - t0 < 20
