"""What killed launchers left: the next launch removes it (csrun.launch.reaper) when it can prove the
owner dead, and nothing a live process could own. (A ``kill -9`` of csrun_wse itself, whose job's
leftovers its watch removes at once: tests/launch/test_stop_signals.py.)"""

from __future__ import annotations

import mmap
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from csrun.launch.owner import OWNER
from csrun.launch.reaper import SHM, reap

pytestmark = pytest.mark.timeout(120)


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
