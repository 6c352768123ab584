"""The chief's link to the cluster's tasks: the emulator's frames over MPI point-to-point messages.

The chief talks to each system and to MemoryX with the same frames as a remote emulator
(:mod:`csrun.emulator.remote.wire`: a JSON header and raw tensor buffers, structured values
encoded without pickling, every size checked before a byte is read), carried by MPI messages on
the job's world communicator instead of a socket: one tag for frames towards the cluster's
tasks, one for their answers, so they never meet the input stream's messages.

A waiting end polls (``Iprobe``) at :class:`~csrun.stream.wire.Backoff`'s pace instead of
spinning in MPICH's blocking receive: a system waiting for its next shard, or the chief for a
step's outputs, leaves the cores to the tasks that work.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from csrun.emulator.remote.wire import Limits, recv_frame, send_frame
from csrun.stream.wire import Backoff

TO_SWARM = 7301
"""Tag of the chief's frames to a system or MemoryX."""
TO_CHIEF = 7302
"""Tag of a system's or MemoryX's frames to the chief."""
LIMITS = Limits()
"""The frames' size limits (the remote emulator's)."""


class LinkClosed(EOFError):
    """The peer did not send within the wait's limit."""


class MpiLink:
    """A byte stream to one peer over MPI messages of one tag each way (a ``wire.Link``)."""

    def __init__(self, comm: Any, peer: int, *, send_tag: int, recv_tag: int, idle: Backoff | None = None,
                 gone: Callable[[], bool] | None = None) -> None:
        """``gone``: asked about once a second while a receive waits; True ends the wait
        (:class:`LinkClosed`): the peer has left without a word."""
        from mpi4py import MPI

        self._mpi = MPI
        self.comm = comm
        self.peer = peer
        self._send_tag = send_tag
        self._recv_tag = recv_tag
        self._idle = idle or Backoff.transfer()
        self._held = memoryview(b"")
        self._gone = gone

    def sendall(self, data: Any) -> None:
        """Send ``data`` as one message."""
        self.comm.Send([memoryview(data).cast("B"), self._mpi.BYTE], dest=self.peer, tag=self._send_tag)

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        """Up to ``nbytes`` of the stream into ``buffer``: the rest of the last message, else the next
        message (received straight into ``buffer`` when it fits)."""
        view = memoryview(buffer).cast("B")
        nbytes = nbytes or len(view)
        if not len(self._held):
            size = self._wait()
            if size <= nbytes:
                self.comm.Recv([view[:size], self._mpi.BYTE], source=self.peer, tag=self._recv_tag)
                return size
            whole = bytearray(size)
            self.comm.Recv([whole, self._mpi.BYTE], source=self.peer, tag=self._recv_tag)
            self._held = memoryview(whole)
        n = min(nbytes, len(self._held))
        view[:n] = self._held[:n]
        self._held = self._held[n:]
        return n

    def ready(self) -> bool:
        """Whether the peer's next frame has begun to arrive (a receive would not wait for it)."""
        return bool(len(self._held)) or bool(self.comm.Iprobe(source=self.peer, tag=self._recv_tag))

    def _wait(self) -> int:
        """The size of the peer's next message, once it is there."""
        status = self._mpi.Status()
        self._idle.reset()
        asked = time.monotonic()
        while not self.comm.Iprobe(source=self.peer, tag=self._recv_tag, status=status):
            if self._gone is not None and time.monotonic() - asked > 1.0:
                if self._gone():
                    raise LinkClosed(f"rank {self.peer} has ended without a word")
                asked = time.monotonic()
            self._idle.idle()
        return status.Get_count(self._mpi.BYTE)

    def send(self, header: dict[str, Any], tensors: list[torch.Tensor] | None = None) -> None:
        """One frame to the peer."""
        send_frame(self, header, tensors)

    def receive(self) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """The peer's next frame (checked against :data:`LIMITS`; raises ``ProtocolError``)."""
        return recv_frame(self, LIMITS)


def chief_link(comm: Any, peer: int) -> MpiLink:
    """The chief's end of the link to rank ``peer`` (a system or MemoryX)."""
    return MpiLink(comm, peer, send_tag=TO_SWARM, recv_tag=TO_CHIEF)


def task_link(comm: Any, chief_gone: Callable[[], bool] | None = None) -> MpiLink:
    """A system's or MemoryX's end of its link to the chief (rank 0); waits at a streamer's pace, and
    gives up once ``chief_gone()`` says the chief has ended."""
    return MpiLink(comm, 0, send_tag=TO_CHIEF, recv_tag=TO_SWARM, idle=Backoff.streamer(), gone=chief_gone)
