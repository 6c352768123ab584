"""The chief's one message that tells a waiting streamer what it is: the job's input worker, or a
copy of the script.

A 2.x script's streamers do not run the user's flow (on the system the user's process drove the
appliance and its input workers only ran the input function). A streamer waits, before any
side effect of the script, for this message from the chief (rank 0, tag :data:`TAG_ASSIGN`):
an 8-byte length, then a :func:`csrun.stream.message.pack` document (JSON values and tensors:
nothing in it is unpickled or run). If the chief's STOP (on the credit tag, see
:mod:`csrun.stream.sender`) comes first, the chief ended without a loop, and
:func:`wait_assignment` returns None, leaving the STOP for the streamer's stream to acknowledge.
A document that does not unpack is a :class:`AssignmentError`.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from csrun.errors import UserError
from csrun.stream.message import pack, unpack
from csrun.stream.wire import TAG_ASSIGN, TAG_CREDIT, Backoff, mpi, wait_for

MAX_ASSIGNMENT = 64 << 20
"""The largest assignment a streamer accepts (bytes); the input function's arguments are configs."""


class AssignmentError(UserError):
    """The chief's assignment could not be read or was too large."""


def encode(document: dict[str, Any]) -> bytes:
    """``document`` as sent (``TypeError`` / ``ValueError`` for a value that is not plain data;
    :class:`AssignmentError` over :data:`MAX_ASSIGNMENT`)."""
    payload = pack(document)
    if len(payload) > MAX_ASSIGNMENT:
        raise AssignmentError(f"the input function's arguments pack to {len(payload)} bytes, over the "
                              f"{MAX_ASSIGNMENT} a streamer accepts: pass configuration, not data")
    return payload


def send_assignment(comm: Any, ranks: list[int], payload: bytes) -> None:
    """Send an :func:`encode`-d assignment to every streamer in ``ranks`` (from the chief)."""
    MPI = mpi()
    size = np.array([len(payload)], dtype=np.int64)
    for rank in ranks:
        comm.Send([size, MPI.INT64_T], dest=rank, tag=TAG_ASSIGN)
        comm.Send([bytearray(payload), MPI.BYTE], dest=rank, tag=TAG_ASSIGN)


def wait_assignment(comm: Any, chief: int = 0) -> dict[str, Any] | None:
    """On a streamer: the chief's assignment, or None when the chief's STOP came first."""
    MPI = mpi()
    seen: list[str] = []

    def ready() -> bool:
        if comm.Iprobe(source=chief, tag=TAG_ASSIGN):
            seen.append("assign")
        elif comm.Iprobe(source=chief, tag=TAG_CREDIT):
            # the chief sends its assignment before anything on the credit tag: one that arrived
            # between the two probes is here now, so look again before taking this for a STOP
            seen.append("assign" if comm.Iprobe(source=chief, tag=TAG_ASSIGN) else "stop")
        return bool(seen)

    wait_for(ready, Backoff.streamer())
    if seen[0] == "stop":
        return None
    size = np.zeros(1, dtype=np.int64)
    comm.Recv([size, MPI.INT64_T], source=chief, tag=TAG_ASSIGN)
    nbytes = int(size[0])
    if not 0 < nbytes <= MAX_ASSIGNMENT:
        raise AssignmentError(f"the chief's assignment declares {nbytes} bytes (accepted: 1..{MAX_ASSIGNMENT})")
    buf = bytearray(nbytes)
    comm.Recv([buf, MPI.BYTE], source=chief, tag=TAG_ASSIGN)
    try:
        document = unpack(bytes(buf))
    except (ValueError, KeyError, TypeError, struct.error, UnicodeDecodeError) as exc:
        raise AssignmentError(f"the chief's assignment does not unpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("role"), str):
        raise AssignmentError("the chief's assignment names no role")
    return document


__all__ = ["TAG_ASSIGN", "MAX_ASSIGNMENT", "AssignmentError", "encode", "send_assignment", "wait_assignment"]
