"""``kill -9`` of csrun_wse: the next launch removes what the job left (csrun.launch.reaper) when it
can prove the owner dead, and nothing a live process could own."""

from __future__ import annotations

import mmap
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from csrun.launch.reaper import reap
from csrun.launch.supervisor import OWNER, SHM
from tests.conftest import BIN

pytestmark = pytest.mark.timeout(120)


def _wait(predicate, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.2)


def test_kill_9_of_the_launcher_leaves_nothing_the_next_launch_keeps(no_slurm_env: dict[str, str],
                                                                        tmp_path: Path) -> None:
    marker = f"csrun-reaper-test-{uuid.uuid4().hex}"
    code = (f"import pathlib, sys, time; from mpi4py import MPI; MPI.COMM_WORLD.Barrier(); "
            f"pathlib.Path(sys.argv[1], f'past_init.{{MPI.COMM_WORLD.rank}}').touch(); time.sleep(120)  # {marker}")
    shm_before = {p.name for p in SHM.glob("mpich_shm_*")}
    launcher = subprocess.Popen([str(BIN / "csrun_wse"), "--total-nodes", "2", sys.executable, "-c", code, str(tmp_path)],
                                env={**no_slurm_env, "TMPDIR": str(tmp_path)}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    def tasks() -> list[str]:
        return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()

    try:
        _wait(lambda: len(list(tmp_path.glob("past_init.*"))) == 2 and list(tmp_path.glob("csrun_job.*")))
        made = [p for p in SHM.glob("mpich_shm_*") if p.name not in shm_before]
        assert made, "the job made no MPICH segment: the check below would hold of nothing"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        _wait(lambda: not tasks(), timeout=30)  # the step died with the launcher
    finally:
        if launcher.poll() is None:
            launcher.kill()
    [state] = list(tmp_path.glob("csrun_job.*"))  # left behind: the supervisor was killed
    assert (state / OWNER).read_text().split()[0] == str(launcher.pid)
    removed = reap((tmp_path,), min_age_s=0, hydra_running=lambda: True)
    assert state in removed and not state.exists()
    ours = [p for p in SHM.glob("mpich_shm_*") if p.name not in shm_before]
    mapped = {line.split(None, 5)[-1] for proc in Path("/proc").glob("[0-9]*")
              for line in _maps(proc) if "/dev/shm/" in line}
    assert all(str(p) in mapped for p in ours), ours  # what is left of the new segments, a live job maps


def _maps(proc: Path) -> list[str]:
    try:
        return (proc / "maps").read_text().splitlines()
    except OSError:
        return []


def test_only_what_is_provably_dead_is_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()

    gone, live, other_host, unowned = (tmp_path / f"csrun_job.{n}" for n in ("gone", "live", "other", "none"))
    for folder in (gone, live, other_host, unowned):
        folder.mkdir()
    (gone / OWNER).write_text(f"{dead.pid} {socket.gethostname()}\n")
    (live / OWNER).write_text(f"{os.getpid()} {socket.gethostname()}\n")
    (other_host / OWNER).write_text(f"{dead.pid} another-node\n")
    old, young = tmp_path / "hydra_hwloc_xmlfile_old", tmp_path / "hydra_hwloc_xmlfile_young"
    for f in (old, young):
        f.write_text("<topology/>")
    os.utime(old, (time.time() - 600, time.time() - 600))
    name = f"mpich_shm_reaper_test_{uuid.uuid4().hex}"
    segment, in_use = SHM / name, SHM / f"{name}_mapped"
    for f in (segment, in_use):
        f.write_bytes(b"\0" * 4096)
        os.utime(f, (time.time() - 600, time.time() - 600))
    with open(in_use, "r+b") as fh, mmap.mmap(fh.fileno(), 4096):
        first = reap((tmp_path,), hydra_running=lambda: True)  # (other jobs' dead segments may go too)
        assert gone in first and segment in first and in_use not in first
        assert in_use.exists() and old.exists()  # mapped; hydra running: its files stay
        second = reap((tmp_path,), hydra_running=lambda: False)
        assert old in second and young not in second
    in_use.unlink()
    assert live.exists() and other_host.exists() and unowned.exists() and young.exists()
