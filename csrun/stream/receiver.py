"""The chief's side: receive batches from every streamer into pre-posted buffers, in a fixed order.

:class:`Receiver` runs the protocol from the chief:

* :meth:`Receiver.start` sends START to every streamer (with the batches it must skip so
  that the stream starts at global batch ``skip``), waits for each HELLO, checks that all
  streamers describe the same batch (schema), then posts a ring of ``prefetch`` receives per
  streamer (one ``Irecv`` per leaf per slot, into buffers owned by the ring) and grants
  ``prefetch`` credits. A streamer only sends a batch the chief has credited, and the chief
  credits a sequence number only after posting its receive: a slow chief never makes the
  streamers (or MPI's unexpected-message queue) hold more than ``prefetch`` batches each,
  and a fast chief never waits on a receive it could have posted.
* :meth:`Receiver.next` returns the next item of the global sequence: streamer 0's batch,
  streamer 1's, ... round-robin, then :data:`~csrun.stream.source.EPOCH_END` once every
  streamer has ended its epoch (a streamer whose epoch ended drops out of the round until
  the others end theirs). The sequence is a function of the data alone. Each consumed
  slot is re-posted for the sequence number ``prefetch`` further on and credited.
* :meth:`Receiver.stop` sends STOP, collects every streamer's STOPPED and statistics,
  completes the receives the streamers filled and cancels the rest.

A batch handed out shares memory with its receive buffer (no copy, except int64 leaves,
which are widened from int32). A buffer is reused for a later receive only once the batch
handed out from it is no longer referenced anywhere (:mod:`csrun.stream.buffers`: checked with
the storage use count); otherwise a fresh buffer is allocated and the old one is left to its user.

Every wait has a deadline (``CSRUN_STREAM_TIMEOUT``, see :mod:`csrun.stream.wire`); an
ERROR from any streamer, a deadline passed, or an MPI failure raises
:class:`~csrun.stream.errors.StreamError` naming the streamer's rank and node.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from csrun.stream.buffers import LENT_TRACKED, BufferPool, BufferSet
from csrun.stream.errors import StreamError
from csrun.stream.schema import Schema
from csrun.stream.source import EPOCH_END
from csrun.stream.stats import StreamerStats
from csrun.stream.wire import (TAG_CREDIT, TAG_CTRL, TAG_DATA, TAG_TEXT, Backoff, Kind, empty_header, wait_for,
                               header, mpi, stream_timeout)

@dataclass
class _Peer:
    """The chief's state for one streamer."""

    rank: int
    node: str = "?"
    pid: int = 0
    pos: int = 0
    """Sequence number of the next batch to hand out from this streamer."""
    events: deque = field(default_factory=deque)
    """Control headers received and not yet acted upon: (kind, a, b)."""
    ctrl_buf: np.ndarray = field(default_factory=empty_header)
    ctrl_req: Any = None
    slots: list = field(default_factory=list)
    """Ring: per slot, (buffer set, requests, sequence number)."""
    sent: int = -1
    """Batches the streamer sent in all (from its STOPPED)."""


class Receiver:
    """The chief's end of the stream from ``ranks`` (see the module manual)."""

    def __init__(self, comm: Any, ranks: list[int], *, prefetch: int = 4, skip: int = 0,
                 timeout: float | None = None) -> None:
        if prefetch < 1:
            raise StreamError(f"prefetch must be at least 1, got {prefetch}")
        if skip < 0:
            raise StreamError(f"skip must be a batch count >= 0, got {skip}")
        self._MPI = mpi()
        self._comm = comm
        self._peers = [_Peer(rank=r) for r in ranks]
        self._prefetch = prefetch
        self._skip = skip
        self.timeout = stream_timeout() if timeout is None else timeout
        """Seconds any one wait may last (``CSRUN_STREAM_TIMEOUT`` unless given)."""
        self.schema: Schema | None = None
        self._pool: BufferPool | None = None
        n = len(self._peers)
        self._cursor = skip % n if n else 0
        self._ended: set[int] = set()
        self._stopped = False

    # -- start ------------------------------------------------------------------------------

    def start(self) -> None:
        """START every streamer, read their HELLOs, check the schemas, post the rings, grant credit."""
        MPI = self._MPI
        n = len(self._peers)
        for k, peer in enumerate(self._peers):
            local_skip = self._skip // n + (1 if k < self._skip % n else 0)
            self._comm.Send([header(Kind.START, local_skip), MPI.INT64_T], dest=peer.rank, tag=TAG_CREDIT)
            self._post_ctrl(peer)
        hellos: dict[int, dict] = {}
        for peer in self._peers:
            kind, _a, _b, doc = self._wait_event(peer, "its first batch (HELLO)", kinds=(Kind.HELLO,))
            peer.node = str(doc.get("node", "?"))
            peer.pid = int(doc.get("pid", 0))
            hellos[peer.rank] = doc
        schemas = {r: Schema.from_json(json.dumps(d["schema"]).encode()) for r, d in hellos.items()}
        first = self._peers[0]
        self.schema = schemas[first.rank]
        for peer in self._peers[1:]:
            if schemas[peer.rank] != self.schema:
                raise StreamError(
                    f"streamer rank {peer.rank} (node {peer.node}) sends batches of "
                    f"{schemas[peer.rank].describe()}, but streamer rank {first.rank} sends "
                    f"{self.schema.describe()}: every streamer must produce the same batch structure")
        self._mark_ended_by_skip(hellos[first.rank].get("batches_per_epoch"))
        # the batches handed out and still alive: the loop's, the device queue's and the one the
        # device runs, a few per streamer; a set no longer tracked is never reused
        self._pool = BufferPool(self.schema.alloc, track=max(LENT_TRACKED, len(self._peers)), arrays=True)
        for peer in self._peers:
            peer.slots = [None] * self._prefetch
            for seq in range(self._prefetch):
                self._post_slot(peer, seq, self._pool.take())  # nothing lent yet: a new set
            self._grant(peer, self._prefetch)

    def _mark_ended_by_skip(self, per_epoch: Any) -> None:
        """After a skip into an epoch, streamers that already gave all of it are out of the round."""
        n = len(self._peers)
        if not self._skip or not isinstance(per_epoch, int) or per_epoch <= 0:
            return
        epoch = self._skip // (n * per_epoch)
        for k in range(n):
            local_skip = self._skip // n + (1 if k < self._skip % n else 0)
            if local_skip // per_epoch > epoch:
                self._ended.add(k)

    def describe(self) -> str:
        """One line naming every streamer: rank, node and process id (to read launcher messages by)."""
        return ", ".join(f"rank {p.rank} ({p.node}, pid {p.pid})" for p in self._peers)

    def _post_ctrl(self, peer: _Peer) -> None:
        peer.ctrl_req = self._comm.Irecv([peer.ctrl_buf, self._MPI.INT64_T], source=peer.rank, tag=TAG_CTRL)

    def _post_slot(self, peer: _Peer, seq: int, bufs: BufferSet) -> None:
        reqs = [self._comm.Irecv([a, self._MPI.BYTE], source=peer.rank, tag=TAG_DATA) for a in bufs.arrays]
        peer.slots[seq % self._prefetch] = (bufs, reqs, seq)

    def _grant(self, peer: _Peer, upto: int) -> None:
        self._comm.Send([header(Kind.CREDIT, upto), self._MPI.INT64_T], dest=peer.rank, tag=TAG_CREDIT)

    # -- control messages -------------------------------------------------------------------

    def _name(self, peer: _Peer) -> str:
        return f"streamer rank {peer.rank} (node {peer.node})"

    def _poll_ctrl(self, peer: _Peer) -> bool:
        """Move every arrived control header of ``peer`` into its event queue; raise on ERROR."""
        progressed = False
        while peer.ctrl_req is not None and peer.ctrl_req.Test():
            kind, a, b = (int(x) for x in peer.ctrl_buf[:3])
            self._post_ctrl(peer)
            progressed = True
            if kind in (Kind.HELLO, Kind.ERROR, Kind.STOPPED):
                doc = self._recv_json(peer, b)
                if kind == Kind.ERROR:
                    raise StreamError(
                        f"streamer rank {doc.get('rank', peer.rank)} (node {doc.get('node', peer.node)}) "
                        f"failed in its input pipeline: {doc.get('error', '?')} (its traceback is in "
                        "its output above)")
                peer.events.append((kind, a, b, doc))
            else:
                peer.events.append((kind, a, b, None))
        return progressed

    def _poll_all(self) -> bool:
        progressed = False
        for peer in self._peers:
            progressed |= self._poll_ctrl(peer)
        return progressed

    def _recv_json(self, peer: _Peer, nbytes: int) -> dict:
        buf = bytearray(nbytes)
        req = self._comm.Irecv([buf, self._MPI.BYTE], source=peer.rank, tag=TAG_TEXT)
        self._wait(lambda: req.Test(), [peer], "a control message")
        try:
            return json.loads(bytes(buf).decode())
        except ValueError:
            raise StreamError(f"{self._name(peer)} sent a malformed control message") from None

    def _wait_event(self, peer: _Peer, what: str, kinds: tuple[int, ...]) -> tuple:
        def ready() -> bool:
            self._poll_all()
            return any(e[0] in kinds for e in peer.events)

        self._wait(ready, [peer], what)
        for i, event in enumerate(peer.events):
            if event[0] in kinds:
                del peer.events[i]
                return event
        raise AssertionError("unreachable")

    def _wait(self, ready: Any, peers: list[_Peer], what: str) -> None:
        deadline = time.monotonic() + self.timeout
        backoff = Backoff.transfer()
        try:
            while not ready():
                if time.monotonic() > deadline:
                    names = ", ".join(self._name(p) for p in peers)
                    raise StreamError(
                        f"waited {self.timeout:g} s for {what} from {names} and got nothing: the "
                        "streamer is stuck or dead (raise CSRUN_STREAM_TIMEOUT if its input "
                        "pipeline is legitimately this slow)")
                backoff.idle()
        except self._MPI.Exception as exc:
            names = ", ".join(self._name(p) for p in peers)
            raise StreamError(f"MPI failed while waiting for {what} from {names}: {exc}") from None

    # -- the sequence ----------------------------------------------------------------------

    def next(self) -> Any:
        """The next batch of the global sequence, or EPOCH_END after every streamer ended its epoch."""
        if self.schema is None or self._stopped:
            raise StreamError("the stream is not running (call start() first, and not after stop())")
        n = len(self._peers)
        while True:
            if len(self._ended) == n:
                self._ended.clear()
                self._cursor = 0
                return EPOCH_END
            k = self._cursor
            self._cursor = (k + 1) % n
            if k in self._ended:
                continue
            item = self._next_from(self._peers[k])
            if item is EPOCH_END:
                self._ended.add(k)
                continue
            return item

    def _next_from(self, peer: _Peer) -> Any:
        MPI = self._MPI
        bufs, reqs, seq = peer.slots[peer.pos % self._prefetch]
        if seq != peer.pos:
            raise AssertionError(f"ring out of step: slot holds {seq}, wanted {peer.pos}")
        state: dict[str, Any] = {}

        def ready() -> bool:
            self._poll_all()
            if self._epoch_end_at(peer):
                state["end"] = True
                return True
            if MPI.Request.Testall(reqs):
                # drain control headers sent before this batch (an epoch end lands before it)
                self._poll_ctrl(peer)
                state["end"] = self._epoch_end_at(peer)
                return True
            return False

        self._wait(ready, [peer], f"batch {peer.pos}")
        if state["end"]:
            return EPOCH_END
        assert self.schema is not None and self._pool is not None
        batch = self.schema.decode(bufs.tensors)
        self._pool.lend(bufs)
        self._post_slot(peer, peer.pos + self._prefetch, self._pool.take())
        peer.pos += 1
        self._grant(peer, peer.pos + self._prefetch)
        return batch

    def _epoch_end_at(self, peer: _Peer) -> bool:
        for i, (kind, a, _b, _doc) in enumerate(peer.events):
            if kind == Kind.EPOCH_END and a == peer.pos:
                del peer.events[i]
                return True
        return False

    # -- stop ------------------------------------------------------------------------------

    def stop(self) -> list[StreamerStats]:
        """Stop every streamer, collect their statistics, settle the posted receives."""
        if self._stopped:
            return []
        self._stopped = True
        MPI = self._MPI
        for peer in self._peers:
            self._comm.Send([header(Kind.STOP), MPI.INT64_T], dest=peer.rank, tag=TAG_CREDIT)
        out = []
        for peer in self._peers:
            def ready(peer: _Peer = peer) -> bool:
                self._poll_all()
                for p in self._peers:  # keep data moving so the streamers' sends complete
                    for slot in p.slots:
                        if slot is not None:
                            MPI.Request.Testall(slot[1])
                return any(e[0] == Kind.STOPPED for e in peer.events)

            self._wait(ready, [peer], "the stop acknowledgement")
            event = next(e for e in peer.events if e[0] == Kind.STOPPED)
            peer.sent = event[1]
            out.append(StreamerStats.from_dict(event[3] or {}))
        for peer in self._peers:
            for slot in peer.slots:
                if slot is None:
                    continue
                _bufs, reqs, seq = slot
                if seq >= peer.sent:
                    for r in reqs:
                        r.Cancel()
                wait_for(lambda reqs=reqs: MPI.Request.Testall(reqs), Backoff.transfer())
            peer.slots = []
            if peer.ctrl_req is not None:
                peer.ctrl_req.Cancel()
                ctrl = peer.ctrl_req
                wait_for(lambda: ctrl.Test(), Backoff.transfer())
                peer.ctrl_req = None
        return out

    def stop_unstarted(self) -> None:
        """Tell streamers that wait for START to leave without streaming."""
        self._stopped = True
        for peer in self._peers:
            self._comm.Send([header(Kind.STOP), self._MPI.INT64_T], dest=peer.rank, tag=TAG_CREDIT)
