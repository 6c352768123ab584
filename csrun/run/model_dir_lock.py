"""One job at a time in a ``model_dir``: a lock naming its holder, gone with the holder.

Two runs writing one ``model_dir`` would interleave their checkpoints and ``losses.csv``, and a
later ``--resume`` would load whichever wrote last. So the chief holds an exclusive
``flock`` on ``model_dir/.csrun.lock`` for as long as it runs: the file names the holder (Slurm
job id, host, pid, start time) and the kernel releases the lock when the process ends, however
it ends (a crash, ``kill -9``, a node reboot of a local filesystem), so a stale lock is never
mistaken for a live one and needs no cleaning. A second run finds the lock taken and stops in
one line naming the holder, before it writes anything (exit 1). The file is removed when the
holder releases it normally; a lock file left by a crash is taken over by the next run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from csrun.cluster import cluster_info
from csrun.errors import EnvironmentFailure, describe_os_error

LOCK_NAME = ".csrun.lock"
"""The lock file's name inside ``model_dir``."""


class ModelDirBusy(EnvironmentFailure):
    """Another run holds the ``model_dir``."""


def _holder(fd: int) -> str:
    """The holder as its lock file says (job, pid, host, start), or why it cannot be read."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 4096).decode() or "{}")
        return (f"job {info.get('job_id') or '-'} (pid {info.get('pid')} on {info.get('host')}, since "
                f"{info.get('started')})")
    except (OSError, ValueError, AttributeError):
        return "another run (its lock file does not say which)"


@contextlib.contextmanager
def model_dir_lock(model_dir: Path) -> Iterator[Path]:
    """Hold ``model_dir``'s lock while the block runs (see the module manual); yields the lock file."""
    path = Path(model_dir) / LOCK_NAME
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise EnvironmentFailure(f"cannot create the lock file {path}: {describe_os_error(exc)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ModelDirBusy(f"model_dir {model_dir} is in use by {holder}: wait for it to end or pass "
                                   f"another -o/--model_dir (nothing of it was touched)") from None
            raise EnvironmentFailure(f"cannot lock {path}: {describe_os_error(exc)}") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file its last holder removed after we opened it
            break
        os.close(fd)
    try:
        info = {"job_id": cluster_info().job_id, "pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still holding it: a run waiting on this inode re-opens the path
        os.close(fd)


__all__ = ["LOCK_NAME", "ModelDirBusy", "model_dir_lock"]
