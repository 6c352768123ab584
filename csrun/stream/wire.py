"""Tags, control headers, timeouts and the polling loop shared by sender and receiver.

Control messages are fixed-size ``numpy.int64`` arrays ``[kind, a, b, c]`` (see the
``Kind`` constants for what ``a``/``b``/``c`` mean). Tags keep the four kinds of traffic
apart on the stream's own communicator (a duplicate of ``MPI.COMM_WORLD``):

``TAG_CTRL``   streamer -> chief: HELLO, EPOCH_END, ERROR, STOPPED headers
``TAG_TEXT``   streamer -> chief: the JSON that follows a HELLO, ERROR or STOPPED header
``TAG_DATA``   streamer -> chief: raw batch buffers, one message per leaf
``TAG_CREDIT`` chief -> streamer: START, CREDIT, STOP headers

Environment variables read:

``CSRUN_STREAM_TIMEOUT``
    Seconds the chief waits for a streamer (its first batch, its next batch, its stop
    acknowledgement) before ending the job with an error naming the rank. Default 60.
``CSRUN_STREAM_ERROR_GRACE``
    Seconds a failed streamer waits for the chief to end the job before it aborts the job
    itself. Default 10.

mpi4py is imported only by :func:`mpi`, so a single-task run never loads MPI.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from csrun.errors import UserError

TAG_CTRL = 11
TAG_TEXT = 12
TAG_DATA = 13
TAG_CREDIT = 14

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


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UserError(f"{name}={raw!r} is not a positive number of seconds")
    return value


def stream_timeout() -> float:
    """``CSRUN_STREAM_TIMEOUT`` in seconds (default 60)."""
    return _env_seconds("CSRUN_STREAM_TIMEOUT", 60.0)


def error_grace() -> float:
    """``CSRUN_STREAM_ERROR_GRACE`` in seconds (default 10)."""
    return _env_seconds("CSRUN_STREAM_ERROR_GRACE", 10.0)


def mpi() -> Any:
    """The ``mpi4py.MPI`` module (imported here, lazily, so single-task runs never load MPI)."""
    from mpi4py import MPI

    return MPI


class Backoff:
    """Polling pace: spin for a while, then sleep a little longer each idle round (up to 1 ms).

    Spinning keeps a large transfer moving (MPICH progresses shared-memory copies only while
    the receiver polls) and latency low. The first ``busy_s`` spin flat out; after that each
    round yields the core (``sched_yield``) so a streamer sharing it still runs; after
    ``spin_s`` without progress the poller sleeps.
    """

    def __init__(self, busy_s: float = 0.002, spin_s: float = 0.05, max_sleep: float = 0.001) -> None:
        self._busy_s = busy_s
        self._spin_s = spin_s
        self._max = max_sleep
        self._since: float | None = None
        self._sleep = 0.0

    def reset(self) -> None:
        """Call after progress."""
        self._since = None
        self._sleep = 0.0

    def idle(self) -> None:
        """Call after a round that made no progress."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        waited = now - self._since
        if waited < self._busy_s:
            return
        if waited < self._spin_s:
            os.sched_yield()
            return
        self._sleep = min(self._max, max(2e-5, self._sleep * 1.5))
        time.sleep(self._sleep)
