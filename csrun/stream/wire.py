"""Tags, control headers, timeouts and the polling loop shared by sender and receiver.

Control messages are fixed-size ``numpy.int64`` arrays ``[kind, a, b, c]`` (see the
``Kind`` constants for what ``a``/``b``/``c`` mean). Tags keep the four kinds of traffic
apart on the stream's own communicator (a duplicate of ``MPI.COMM_WORLD``):

``TAG_CTRL``   streamer -> chief: HELLO, EPOCH_END, ERROR, STOPPED headers
``TAG_TEXT``   streamer -> chief: the JSON that follows a HELLO, ERROR or STOPPED header
``TAG_DATA``   streamer -> chief: raw batch buffers, one message per leaf
``TAG_CREDIT`` chief -> streamer: START, CREDIT, STOP headers
``TAG_ASSIGN`` chief -> streamer: a 2.x streamer's role, before any stream (:mod:`csrun.stream.assignment`)

Environment variables read (declared, with their defaults and bounds, in :mod:`csrun.env_settings`):

``CSRUN_STREAM_TIMEOUT``
    Seconds the chief waits for a streamer (its first batch, its next batch, its stop
    acknowledgement) before ending the job with an error naming the rank.
``CSRUN_STREAM_ERROR_GRACE``
    Seconds a failed streamer waits for the chief to end the job before it aborts the job
    itself.
``CSRUN_MPI_INIT_TIMEOUT``
    Seconds a task may wait in ``MPI_Init`` (it waits there for every other task of the job)
    before it gives up with one line (exit code 137). ``MPI_Init`` cannot be
    interrupted, so a watchdog process ends the task: a task that exited before joining MPI
    (a failed import, a missing data folder) no longer leaves the others waiting forever, even
    under a plain ``mpiexec`` or ``srun`` that csrun did not start (csrun_wse also ends the job
    as soon as any task exits non-zero: :mod:`csrun.launch.supervisor`).
``CSRUN_MPI_ARRIVALS``
    ``on`` (the default) or ``off``: the tasks sharing a node wait for each other asleep before
    ``MPI_Init`` (:mod:`csrun.stream.arrivals`).
``CSRUN_MPI_ARRIVALS_WAIT``
    The most seconds a task waits there for a peer on its node that never signs in (one that
    is not csrun's) before it calls ``MPI_Init`` anyway.

mpi4py is imported only by :func:`mpi`, so a single-task run never loads MPI.
"""

from __future__ import annotations

import array
import fcntl
import os
import stat
import subprocess
import sys
import termios
import time
from typing import Any

import numpy as np

from csrun.env_settings import env_settings
from csrun.task_exits import last_word
from csrun.cluster import cluster_info
from csrun.stream import arrivals

TAG_CTRL = 11
TAG_TEXT = 12
TAG_DATA = 13
TAG_CREDIT = 14
TAG_ASSIGN = 15

HEADER_LEN = 4


class Kind:
    """Control message kinds (``header[0]``)."""

    HELLO = 1
    """streamer: ``a`` = batches per epoch or -1, ``b`` = JSON length (schema, rank, node)."""
    EPOCH_END = 2
    """streamer: ``a`` = batches sent before the end of the epoch, ``b`` = epoch number."""
    ERROR = 3
    """streamer: ``a`` = batches sent, ``b`` = JSON length (rank, node, the exception's last line)."""
    STOPPED = 4
    """streamer: ``a`` = batches sent in all, ``b`` = JSON length (its stats)."""
    START = 5
    """chief: ``a`` = batches this streamer skips before its first."""
    CREDIT = 6
    """chief: ``a`` = the streamer may send batches with sequence number < ``a``."""
    STOP = 7
    """chief: stop streaming, acknowledge with STOPPED."""


def header(kind: int, a: int = 0, b: int = 0, c: int = 0) -> np.ndarray:
    """A control header as sent on the wire."""
    return np.array([kind, a, b, c], dtype=np.int64)


def empty_header() -> np.ndarray:
    """A buffer to receive a control header into."""
    return np.zeros(HEADER_LEN, dtype=np.int64)


def stream_timeout() -> float:
    """``CSRUN_STREAM_TIMEOUT`` in seconds (:mod:`csrun.env_settings`)."""
    return env_settings().stream_timeout


def error_grace() -> float:
    """``CSRUN_STREAM_ERROR_GRACE`` in seconds (:mod:`csrun.env_settings`)."""
    return env_settings().stream_error_grace


def mpi_init_timeout() -> float:
    """``CSRUN_MPI_INIT_TIMEOUT`` in seconds (:mod:`csrun.env_settings`)."""
    return env_settings().mpi_init_timeout


_mpi_ready = False
_WATCHDOG = ("import os, sys, time; time.sleep(float(sys.argv[1])); sys.stderr.write(sys.argv[2] + '\\n'); "
             "sys.stderr.flush(); os.getppid() == int(sys.argv[3]) and os.kill(int(sys.argv[3]), 9)")


def mpi() -> Any:
    """The ``mpi4py.MPI`` module (imported here, lazily, so single-task runs never load MPI).

    The first call initialises MPI under a watchdog (``CSRUN_MPI_INIT_TIMEOUT``): a task whose
    peers never join ends with one line instead of waiting forever. Before ``MPI_Init`` the task
    sleeps until the other tasks on its node have come (:mod:`csrun.stream.arrivals`), since
    MPICH's ``MPI_Init`` spins while it waits for them. ``MPI_Init`` holds the GIL,
    so the watchdog is a separate small Python process that prints the line and SIGKILLs this one
    (exit 137) unless it is stopped first."""
    global _mpi_ready
    if _mpi_ready:
        from mpi4py import MPI

        return MPI
    limit = mpi_init_timeout()
    rank = cluster_info().rank
    line = (f"csrun: rank {rank}: MPI_Init did not complete within {limit:g} s: a task of this job exited (or "
            f"never started) before joining MPI; ending this task (CSRUN_MPI_INIT_TIMEOUT)")
    watchdog = subprocess.Popen([sys.executable, "-S", "-E", "-c", _WATCHDOG, f"{limit:g}", line, str(os.getpid())],
                                stdin=subprocess.DEVNULL)
    board = None
    try:
        board = _sign_in_on_the_board()
        from mpi4py import MPI

        MPI.COMM_WORLD.Get_rank()  # MPI_Init has run by now (mpi4py initialises on import)
    finally:
        watchdog.kill()
        watchdog.wait()
        arrivals.leave(board)
    _mpi_ready = True
    return MPI


def group_communicator(world: Any, ranks: list[int]) -> Any:
    """A communicator of ``world``'s ``ranks`` (in that order), made by those tasks only
    (``MPI_Comm_create_group``: collective over them, not over the world)."""
    group = world.Get_group().Incl(ranks)
    try:
        return world.Create_group(group)
    finally:
        group.Free()


def _sign_in_on_the_board() -> arrivals.Board | None:
    """Wait asleep until this node's other tasks have come (MPICH's MPI_Init spins while it waits for
    them): :mod:`csrun.stream.arrivals`. The board, for ``leave`` after MPI_Init; None without one."""
    settings = env_settings()
    limit = settings.mpi_arrivals_wait
    try:
        board = arrivals.board_for(cluster_info()) if settings.mpi_arrivals else None
    except OSError:  # no usable temporary folder (tempfile.gettempdir): no board
        return None
    if board is None or not arrivals.sign_in(board):
        return None
    try:
        wait_for(board.everyone_in, Backoff.arrival(), deadline=time.monotonic() + limit, what="tasks on this node")
    except TimeoutError:
        pass  # a peer that is not csrun's never signs in: MPI_Init waits for it as before
    return board


def abort_after_output(comm: Any, cause: str = "") -> None:
    """``MPI_Abort`` (exit status 1) on ``comm``, once stdout and stderr are flushed and read by the
    launcher (:func:`wait_until_output_read`): every abort site's last words reach the console,
    and the launcher learns this task's end from it (:func:`csrun.task_exits.last_word`)."""
    info = cluster_info()
    last_word(1, info.rank, info.node_name, cause)
    sys.stdout.flush()
    sys.stderr.flush()
    wait_until_output_read()
    comm.Abort(1)


def wait_until_output_read(limit_s: float = 1.0) -> None:
    """Before ``MPI_Abort``: give the launcher up to ``limit_s`` to read what this task wrote into
    its stdout and stderr pipes (flush them first).

    MPI_Abort makes mpiexec's proxy kill every task and stop forwarding at once: the message
    just written (still in the pipe) was lost in about one abort in seven under a plain
    mpiexec. A pipe's unread byte count (``FIONREAD``) says when the proxy has taken it."""
    deadline = time.monotonic() + limit_s
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                continue
            pending = array.array("i", [0])
            while time.monotonic() < deadline:
                fcntl.ioctl(fd, termios.FIONREAD, pending)
                if pending[0] == 0:
                    break
                time.sleep(0.005)
        except (OSError, ValueError, AttributeError):
            continue


class Backoff:
    """How a task waits on MPI without burning a core: poll, and sleep a little longer each idle round.

    MPICH's blocking calls (``Recv``, ``Wait``) spin inside its progress engine, and so would a
    loop of ``Test`` calls: a waiting streamer took much of a core from the chief it feeds. A
    waiter here polls flat out only for ``busy_s`` (a batch that is about to land costs no
    latency), then sleeps between polls, each sleep 1.5x the last from ``min_sleep`` up to
    ``max_sleep``. Every poll also drives MPICH's progress, so a large transfer keeps moving.

    What waiting costs: one poll per ``max_sleep`` once settled, a small share
    of a core; a ready message is seen within ``max_sleep``. Four paces are used:
    :meth:`transfer` while data must move now (the chief waiting for a batch, a streamer that
    must retire sends before posting more: MPICH copies a large shared-memory message only while
    both sides poll, so 2 ms flat out covers a 4 MB batch, then sleeps up to 0.5 ms);
    :meth:`sending` (a streamer waiting for credit while its sends are in flight: they land in
    slots the chief reads when it takes its next batch, so spinning would not move them sooner;
    it sleeps from the first idle round, 20 µs growing to 0.5 ms, so a chief that waits for one
    of them sees it move within 0.5 ms); :meth:`streamer` (waiting for credit or START with
    nothing in flight: no busy phase, at most 5 ms asleep; its next batch is already in the
    chief's ring); and :meth:`arrival` (on the board before ``MPI_Init``, where peers come in
    seconds: 1 ms growing to 50 ms). What each pace costs on the README's main job: BENCHMARKS.md (``bench/stream/idle_cpu.py``).
    """

    def __init__(self, busy_s: float = 0.002, min_sleep: float = 20e-6, max_sleep: float = 0.0005,
                 yields: bool = False) -> None:
        self._busy_s = busy_s
        self._yields = yields
        self._min = min_sleep
        self._max = max_sleep
        self._since: float | None = None
        self._sleep = 0.0

    @classmethod
    def arrival(cls) -> "Backoff":
        """The pace on the arrival board before ``MPI_Init``: sleeps from 1 ms up to 50 ms."""
        return cls(busy_s=0.0, min_sleep=0.001, max_sleep=0.05)

    @classmethod
    def transfer(cls) -> "Backoff":
        """The pace while a transfer is due or under way: 2 ms flat out, then sleeps up to 0.5 ms."""
        return cls(busy_s=0.002, min_sleep=20e-6, max_sleep=0.0005)

    @classmethod
    def collective(cls) -> "Backoff":
        """A rank in a collective with others (SwarmX): the transfer's pace, but the busy phase
        gives the core up between polls (``sched_yield``), as MPICH's own blocking calls do, so a
        peer that shares the core and must take its part gets it at once."""
        return cls(busy_s=0.002, min_sleep=20e-6, max_sleep=0.0005, yields=True)

    @classmethod
    def sending(cls) -> "Backoff":
        """A streamer waiting for credit with sends in flight: sleeps from the first idle round, 20 µs up to 0.5 ms."""
        return cls(busy_s=0.0, min_sleep=20e-6, max_sleep=0.0005)

    @classmethod
    def streamer(cls) -> "Backoff":
        """A streamer's pace: it sleeps from the first idle round, up to 5 ms."""
        return cls(busy_s=0.0, min_sleep=100e-6, max_sleep=0.005)

    @property
    def sleep_s(self) -> float:
        """The current sleep between polls (0 while busy)."""
        return self._sleep

    def reset(self) -> None:
        """Call after progress."""
        self._since = None
        self._sleep = 0.0

    def idle(self) -> None:
        """Call after a round that made no progress."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if now - self._since < self._busy_s:
            if self._yields:
                os.sched_yield()
            return
        self._sleep = min(self._max, max(self._min, self._sleep * 1.5))
        time.sleep(self._sleep)


def wait_for(ready: Any, backoff: Backoff, *, deadline: float | None = None, what: str = "") -> None:
    """Poll ``ready()`` at ``backoff``'s pace until it is true; past ``deadline`` (a
    ``time.monotonic()`` value) raise :class:`TimeoutError` naming ``what``."""
    while not ready():
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"no {what} before the deadline")
        backoff.idle()
