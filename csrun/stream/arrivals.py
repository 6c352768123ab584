"""The tasks sharing a node wait for each other asleep before ``MPI_Init``, instead of spinning.

MPICH's ``MPI_Init`` waits for every task on the node at a shared-memory barrier that spins
(``sched_yield`` in a loop). A streamer reaches ``MPI_Init`` (its Session) seconds before a
chief that is still building its model and optimizer, so on a node they share it burned a
whole core per streamer and took it from the chief: a 3-task fc_mnist job took longer
on 2 cores (BENCHMARKS.md, ``bench/stream/mpi_init.py``). Across nodes the wait is a blocking
PMI read that costs nothing, so only the tasks sharing a node matter.

The arrival board: :func:`sign_in` writes one file named after the task's local rank into a
folder only this user can write; :func:`csrun.stream.wire.mpi` then sleeps (``wait_for`` at
:meth:`~csrun.stream.wire.Backoff.arrival`'s pace) until :meth:`Board.everyone_in`, and only
then calls ``MPI_Init``. :func:`leave` removes this task's file once ``MPI_Init`` has returned
(every peer on the node is past the board by then) and the folder when it is the last; a board
left by tasks killed inside ``MPI_Init`` is removed by the next mpiexec launch of this user on
the node once its ``hydra_pmi_proxy`` is gone.

Which tasks share the node (:attr:`~csrun.cluster.ClusterInfo.local_tasks`) and the key that
names one launch's board:

- MPICH's ``mpiexec`` (hydra; ``csrun_wse`` and ``csrun_cpu`` in local mode, or plain): keyed by
  the ``hydra_pmi_proxy`` process that started the tasks (its pid and start time);
- a plain Slurm step (``srun``): keyed by :attr:`~csrun.cluster.ClusterInfo.node_step`;
- anything else (a heterogeneous step, Open MPI, an unknown launcher): no board; ``MPI_Init``
  waits as before.

The board never makes a job fail: a folder another user owns or others may write, or a file
that cannot be written, skips it; a peer that never signs in (a task that is not csrun's) only
holds the others for ``CSRUN_MPI_ARRIVALS_WAIT`` seconds; ``CSRUN_MPI_ARRIVALS=off`` turns the
board off (both read by :mod:`csrun.stream.wire`).
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from csrun.cluster import ClusterInfo

_PROXY = "hydra_pmi_proxy"


@dataclass(frozen=True)
class Board:
    """One launch's arrival board on this node: its folder, this task's name on it, how many come."""

    folder: Path
    name: str
    expected: int

    def everyone_in(self) -> bool:
        """Has every task on the node signed in? (True when the folder cannot be read: wait no more.)"""
        try:
            return sum(1 for entry in os.scandir(self.folder) if entry.name.startswith("rank-")) >= self.expected
        except OSError:
            return True


def _proc_stat(pid: int) -> tuple[str, int, str] | None:
    """(command name, parent pid, start time) of a process, from ``/proc``; None if unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    head, _, tail = text.rpartition(")")
    fields = tail.split()
    if "(" not in head or len(fields) < 20:
        return None
    return head.split("(", 1)[1], int(fields[1]), fields[19]


def _hydra_key() -> str | None:
    """``proxy-<pid>-<start>`` of the ``hydra_pmi_proxy`` above this process, or None."""
    current = os.getpid()
    for _ in range(8):  # the task, csrun's task wrapper, a shell: the proxy is a few levels up
        info = _proc_stat(current)
        if info is None:
            return None
        name, parent, start = info
        if name == _PROXY:
            return f"proxy-{current}-{start}"
        if parent <= 1:
            return None
        current = parent
    return None


def board_for(info: ClusterInfo, *, hydra_key: str | None = None) -> Board | None:
    """The board this task uses (None: no board; see the module docstring).

    ``hydra_key`` stands in for the ``hydra_pmi_proxy`` lookup (tests)."""
    if info.local_tasks < 2:
        return None
    key = f"slurm-{info.node_step}" if info.node_step else (hydra_key or _hydra_key())
    if key is None:
        return None
    folder = Path(tempfile.gettempdir()) / f"csrun-mpi-arrivals-{os.getuid()}-{key}"
    return Board(folder=folder, name=f"rank-{info.local_rank}", expected=info.local_tasks)


def _own_folder(folder: Path) -> bool:
    """Create the board's folder (0700) or accept it only if this user owns it and no one else may write."""
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _sweep_stale(root: Path) -> None:
    """Remove this user's mpiexec boards whose ``hydra_pmi_proxy`` is gone (tasks killed inside
    ``MPI_Init`` never leave theirs)."""
    pattern = re.compile(rf"csrun-mpi-arrivals-{os.getuid()}-proxy-(\d+)-(\d+)")
    try:
        entries = [e for e in os.scandir(root) if pattern.fullmatch(e.name)]
    except OSError:
        return
    for entry in entries:
        found = pattern.fullmatch(entry.name)
        info = _proc_stat(int(found.group(1))) if found else None
        if found is None or (info is not None and info[0] == _PROXY and info[2] == found.group(2)):
            continue  # its launch is still running
        try:
            for item in os.scandir(entry.path):
                if item.name.startswith("rank-"):
                    os.unlink(item.path)
            os.rmdir(entry.path)
        except OSError:
            pass


def sign_in(board: Board) -> bool:
    """Write this task's file on the board; False when the board cannot be used (then wait not)."""
    _sweep_stale(board.folder.parent)
    if not _own_folder(board.folder):
        return False
    try:
        (board.folder / board.name).touch()
    except OSError:
        return False
    return True


def leave(board: Board | None) -> None:
    """After ``MPI_Init``: remove this task's file, and the folder if it is empty now."""
    if board is None:
        return
    try:
        (board.folder / board.name).unlink()
    except OSError:
        pass
    try:
        board.folder.rmdir()
    except OSError:
        pass  # a peer's file is still there: the last one out removes the folder
