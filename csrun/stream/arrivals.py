"""Wait for this node's other tasks before ``MPI_Init``, asleep instead of spinning.

MPICH's ``MPI_Init`` waits for every task on the node at a shared-memory barrier that spins
(``sched_yield`` in a loop). A streamer reaches ``MPI_Init`` (its Session) seconds before a
chief that is still building its model and optimizer, so on a node they share it burned a
whole core per streamer and took it from the chief: a 3-task fc_mnist job started ~1 s slower
on 2 cores (BENCHMARKS.md, ``bench/stream/mpi_init.py``). Across nodes the wait is a blocking
PMI read that costs nothing, so only the tasks sharing a node matter.

:func:`wait_for_node_peers` is the arrival board: each task on the node writes one file named
after its local rank into a folder only this user can write, then sleeps (1 ms growing to
50 ms between looks) until the folder holds one file per task on the node, and only then calls
``MPI_Init``. :func:`leave` removes this task's file once ``MPI_Init`` has returned (every
peer on the node is past the board by then) and the folder when it is the last; a board left by
tasks killed inside ``MPI_Init`` is removed by the next mpiexec launch of this user on the node
once its ``hydra_pmi_proxy`` is gone.

Which tasks share the node, and the key that names one launch's board:

- MPICH's ``mpiexec`` (hydra; ``csrun_wse`` and ``csrun_cpu`` in local mode, or plain):
  ``MPI_LOCALNRANKS`` tasks, keyed by the ``hydra_pmi_proxy`` process that started them (its
  pid and start time);
- a plain Slurm step (``srun``): this node's entry of ``SLURM_STEP_TASKS_PER_NODE`` (``2,1``
  or ``2(x3)``) at ``SLURM_NODEID``, keyed by ``SLURM_JOB_ID``, ``SLURM_STEP_ID`` and the node;
- anything else (a heterogeneous step, Open MPI, an unknown launcher): no board; ``MPI_Init``
  waits as before.

The board never makes a job fail: a folder another user owns, or a file that cannot be
written, skips it, and a peer that never writes its file (a task that is not csrun's) only
holds the others for ``CSRUN_MPI_ARRIVALS_WAIT`` seconds (default 30) before they call
``MPI_Init`` anyway. ``CSRUN_MPI_ARRIVALS=off`` turns the board off. A task that exits before
MPI is still caught by ``CSRUN_MPI_INIT_TIMEOUT`` (:func:`csrun.stream.wire.mpi`'s watchdog
covers the board's wait too).
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

ENV_SWITCH = "CSRUN_MPI_ARRIVALS"
ENV_WAIT = "CSRUN_MPI_ARRIVALS_WAIT"
DEFAULT_WAIT_S = 30.0
_PROXY = "hydra_pmi_proxy"


@dataclass(frozen=True)
class Board:
    """One launch's arrival board on this node: its folder, this task's name on it, how many come."""

    folder: Path
    name: str
    expected: int


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


def _hydra_key(pid: int | None = None) -> str | None:
    """``proxy-<pid>-<start>`` of the ``hydra_pmi_proxy`` above this process, or None."""
    current = os.getpid() if pid is None else pid
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


def tasks_on_node(tasks_per_node: str, node_id: int) -> int | None:
    """This node's count in Slurm's ``SLURM_STEP_TASKS_PER_NODE`` form (``2,1``, ``2(x3),1``), or None."""
    nodes: list[int] = []
    for part in tasks_per_node.split(","):
        found = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if found is None:
            return None
        nodes += [int(found.group(1))] * int(found.group(2) or 1)
    return nodes[node_id] if 0 <= node_id < len(nodes) else None


def board_for(env: Mapping[str, str], *, hydra_key: str | None = None) -> Board | None:
    """The board this task uses, from its environment (None: no board; see the module docstring).

    ``hydra_key`` stands in for the ``hydra_pmi_proxy`` lookup (tests)."""
    if env.get(ENV_SWITCH, "").strip().lower() in ("off", "0", "false", "no"):
        return None
    root = Path(tempfile.gettempdir())
    local = env.get("MPI_LOCALNRANKS", "").strip()
    if local.isdigit() and env.get("MPI_LOCALRANKID", "").strip().isdigit():
        key = hydra_key if hydra_key is not None else _hydra_key()
        if key is None:
            return None
        expected, rank = int(local), env["MPI_LOCALRANKID"].strip()
    elif env.get("SLURM_STEP_ID", "").strip() and not env.get("SLURM_HET_SIZE", "").strip():
        job, step = env.get("SLURM_JOB_ID", "").strip(), env["SLURM_STEP_ID"].strip()
        node, rank = env.get("SLURM_NODEID", "").strip(), env.get("SLURM_LOCALID", "").strip()
        if not (job.isdigit() and step.isdigit() and node.isdigit() and rank.isdigit()):
            return None
        count = tasks_on_node(env.get("SLURM_STEP_TASKS_PER_NODE", ""), int(node))
        if count is None:
            return None
        key, expected = f"slurm-{job}.{step}-node{node}", count
    else:
        return None
    if expected < 2:
        return None
    return Board(folder=root / f"csrun-mpi-arrivals-{os.getuid()}-{key}", name=f"rank-{rank}", expected=expected)


def _wait_limit(env: Mapping[str, str]) -> float:
    raw = env.get(ENV_WAIT, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_WAIT_S
    except ValueError:
        value = DEFAULT_WAIT_S
    return value if value >= 0 else DEFAULT_WAIT_S


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


def wait_for_node_peers(environ: Mapping[str, str] | None = None) -> Board | None:
    """Sign this task in on its node's board and sleep until every task on the node has.

    Returns the board (hand it to :func:`leave` after ``MPI_Init``), or None when no board is
    used. Returns after ``CSRUN_MPI_ARRIVALS_WAIT`` seconds even if a peer never signs in."""
    env = os.environ if environ is None else environ
    try:
        board = board_for(env)
    except OSError:  # no usable temporary folder (tempfile.gettempdir): no board
        return None
    if board is None:
        return None
    _sweep_stale(board.folder.parent)
    if not _own_folder(board.folder):
        return None
    try:
        (board.folder / board.name).touch()
    except OSError:
        return None
    deadline = time.monotonic() + _wait_limit(env)
    pause = 0.001
    while time.monotonic() < deadline:
        try:
            arrived = sum(1 for entry in os.scandir(board.folder) if entry.name.startswith("rank-"))
        except OSError:
            break
        if arrived >= board.expected:
            break
        time.sleep(pause)
        pause = min(pause * 1.5, 0.05)
    return board


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
