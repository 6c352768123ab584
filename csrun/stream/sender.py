"""The streamer's side: send a shard to the chief, batch after batch, within the credit granted.

:func:`run_streamer` is the whole life of a streamer inside a session:

1. wait for START from the chief (it says how many batches to skip; STOP instead means the
   chief ended without streaming);
2. load the first batch, send HELLO with the schema (JSON) and this task's rank and node;
3. for every batch: check it against the schema, encode it (int64 -> int32, checked), wait
   until the chief has granted credit for its sequence number (the chief posts the receive
   before it grants, so every batch lands in a buffer already waiting for it), then send one
   raw buffer per leaf (``Isend``; at most two batches in flight, so loading the next
   batch overlaps sending this one);
   after each epoch send an EPOCH_END header carrying the sequence number where it fell;
4. on STOP: finish the sends in flight, send STOPPED with this streamer's statistics.

A batch's float (and other non-int64) leaves are sent from the loader's own memory (no copy; an
int64 leaf is sent from its int32 conversion), and a send may still be in flight while the
next batch loads: an input pipeline must hand over new tensors for each batch, not refill the
ones it yielded before (torch's ``default_collate`` does). One that refills them with torch's
in-place operations (``torch.stack(..., out=x)``, ``x.copy_(...)``) ends the job at its next
batch with a :class:`~csrun.stream.errors.BatchError` naming the leaf
(:func:`~csrun.stream.refill.check_untouched` over the last two batches sent: each tensor's
version counter against its value when the batch was sent; the lone chief refuses the same
pipeline) instead of training on batches that may mix two (the chief may have run one step on
such a batch by then). Not seen: writes through a numpy view (they do not move the counter) and
writes into a leaf that shares its storage with more than itself (the counter is the storage's,
moved by writes anywhere in it, most of them harmless). Unlike the lone chief, which copies each
batch into buffers of its own (:mod:`csrun.stream.local`), a streamer does not copy: on one node
MPI's transfer is itself a shared-memory copy, and one more copy would cost large batches much of
its speed (see BENCHMARKS.md, ``bench/stream/run.py`` part a).

An exception in the input pipeline (or a batch that cannot be streamed) is printed here with
its traceback, sent to the chief as ERROR (rank, node, the exception's last line), and then
the streamer waits ``CSRUN_STREAM_ERROR_GRACE`` seconds for the chief to end the job before
aborting it itself, so the job always ends.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections import deque
from typing import Any

from csrun.stream.errors import BatchError
from csrun.task_exits import describe, last_word
from csrun.stream.refill import REFILL_WATCH, check_untouched, sent_in_place
from csrun.stream.schema import Schema
from csrun.stream.source import EPOCH_END, BatchSource
from csrun.stream.stats import StreamerStats
from csrun.stream.wire import (TAG_CREDIT, TAG_CTRL, TAG_DATA, TAG_TEXT, Backoff, Kind, abort_after_output,
                               empty_header, error_grace, header, mpi, wait_for)

_MAX_TEXT = 16384
_INFLIGHT = 2
"""Batches a streamer may have in flight at once (each within credit, so already awaited)."""


class _Credit:
    """The streamer's view of the chief's grants: a standing receive for START/CREDIT/STOP."""

    def __init__(self, comm: Any, chief: int) -> None:
        self._MPI = mpi()
        self._comm, self._chief = comm, chief
        self._buf = empty_header()
        self.upto = 0
        self.stopped = False
        self._req = comm.Irecv([self._buf, self._MPI.INT64_T], source=chief, tag=TAG_CREDIT)

    def poll(self) -> None:
        """Take in every grant that has arrived."""
        while not self.stopped and self._req.Test():
            kind, value = int(self._buf[0]), int(self._buf[1])
            if kind == Kind.CREDIT:
                self.upto = max(self.upto, value)
            elif kind == Kind.STOP:
                self.stopped = True
                return
            self._req = self._comm.Irecv([self._buf, self._MPI.INT64_T], source=self._chief, tag=TAG_CREDIT)

    def cancel(self) -> None:
        """Withdraw the standing receive (after STOP it is already complete)."""
        if not self.stopped:
            self._req.Cancel()
            req = self._req
            wait_for(lambda: req.Test(), Backoff.streamer())


def run_streamer(comm: Any, source: BatchSource, *, node: str, chief: int = 0) -> StreamerStats:
    """Stream ``source`` to the chief until it says stop; return this streamer's statistics.

    On an error in the input pipeline this function does not return: it reports the error
    to the chief and the job is aborted (by the chief, or by this streamer after the grace).
    """
    MPI = mpi()
    rank = comm.Get_rank()
    stats = StreamerStats(rank=rank, node=node)
    start = empty_header()
    first = comm.Irecv([start, MPI.INT64_T], source=chief, tag=TAG_CREDIT)
    wait_for(lambda: first.Test(), Backoff.streamer())  # START comes after the chief's setup: sleep, don't spin
    if int(start[0]) == Kind.STOP:
        _send_json(comm, chief, Kind.STOPPED, 0, stats.__dict__)
        return stats
    skip = int(start[1])
    credit = _Credit(comm, chief)
    try:
        _stream(comm, chief, source, skip, credit, stats)
    except Exception as exc:  # the user's pipeline: report it, then end the job
        _fail(comm, chief, rank, node, stats.batches, exc, credit)
    credit.cancel()
    _send_json(comm, chief, Kind.STOPPED, stats.batches, stats.__dict__)
    return stats


def _stream(comm: Any, chief: int, source: BatchSource, skip: int, credit: _Credit,
            stats: StreamerStats) -> None:
    MPI = mpi()
    items = source.stream(skip)
    schema: Schema | None = None
    inflight: deque[tuple[list[Any], list[Any]]] = deque()  # (requests, buffers they read)
    handed: deque[list[Any]] = deque(maxlen=REFILL_WATCH)  # sent_in_place of the last batches sent
    epoch = 0
    t_start = time.monotonic()
    backoff, moving = Backoff.streamer(), Backoff.sending()
    while True:
        credit.poll()
        if credit.stopped:
            break
        t0 = time.monotonic()
        item = next(items)
        stats.pipeline_s += time.monotonic() - t0
        check_untouched(handed)
        if item is EPOCH_END:
            if schema is None:
                raise BatchError(f"the shard of streamer rank {comm.Get_rank()} yielded no batch in "
                                 f"epoch {epoch}: it is smaller than one batch")
            comm.Send([header(Kind.EPOCH_END, stats.batches, epoch), MPI.INT64_T], dest=chief, tag=TAG_CTRL)
            epoch += 1
            continue
        if schema is None:
            schema = Schema.infer(item)
            hello = {"schema": json.loads(schema.to_json()), "rank": comm.Get_rank(),
                     "node": stats.node, "pid": os.getpid(), "batches_per_epoch": source.batches_per_epoch()}
            _send_json(comm, chief, Kind.HELLO, -1 if source.batches_per_epoch() is None
                       else int(source.batches_per_epoch() or 0), hello)
        tensors = schema.flatten(item)
        buffers = schema.encode_leaves(tensors)
        watched = sent_in_place(schema, tensors)
        credit.poll()
        if stats.batches >= credit.upto and not credit.stopped:
            t0, c0 = time.monotonic(), time.process_time()
            backoff.reset()
            moving.reset()
            while stats.batches >= credit.upto and not credit.stopped:
                while inflight and MPI.Request.Testall(inflight[0][0]):
                    inflight.popleft()
                credit.poll()
                (moving if inflight else backoff).idle()  # sends in flight move only while polled: poll them, asleep between
            stats.credit_wait_s += time.monotonic() - t0
            stats.credit_wait_cpu_s += time.process_time() - c0
        if credit.stopped:
            break
        while len(inflight) >= _INFLIGHT:
            oldest = inflight.popleft()[0]
            wait_for(lambda: MPI.Request.Testall(oldest), Backoff.transfer())
        # the buffers must live until their sends complete: they stay in ``inflight``
        inflight.append(([comm.Isend([b, MPI.BYTE], dest=chief, tag=TAG_DATA) for b in buffers], buffers))
        handed.append(watched)  # the last REFILL_WATCH batches, whether or not their sends completed
        stats.batches += 1
        stats.bytes += schema.nbytes
    while inflight:
        oldest = inflight.popleft()[0]
        wait_for(lambda: MPI.Request.Testall(oldest), Backoff.transfer())
    stats.seconds = time.monotonic() - t_start


def _send_json(comm: Any, chief: int, kind: int, a: int, doc: dict[str, Any]) -> None:
    """A ``[kind, a, json_len]`` header on TAG_CTRL, then the JSON on TAG_TEXT."""
    MPI = mpi()
    payload = json.dumps(doc).encode()
    hdr = header(kind, a, len(payload))
    comm.Send([hdr, MPI.INT64_T], dest=chief, tag=TAG_CTRL)
    comm.Send([bytearray(payload), MPI.BYTE], dest=chief, tag=TAG_TEXT)


def _fail(comm: Any, chief: int, rank: int, node: str, sent: int, exc: Exception, credit: _Credit) -> None:
    MPI = mpi()
    last = describe(exc)
    text = traceback.format_exc()
    last_word(1, rank, node, f"its input pipeline failed: {last}")  # this task's failure is the job's, whoever aborts it
    sys.stderr.write(f"csrun: streamer rank {rank} (node {node}) failed in its input pipeline:\n{text}")
    sys.stderr.flush()
    doc = {"rank": rank, "node": node, "error": last[:_MAX_TEXT], "traceback": text[-_MAX_TEXT:]}
    payload = bytearray(json.dumps(doc).encode())
    deadline = time.monotonic() + error_grace()
    try:
        reqs = [comm.Isend([header(Kind.ERROR, sent, len(payload)), MPI.INT64_T], dest=chief, tag=TAG_CTRL),
                comm.Isend([payload, MPI.BYTE], dest=chief, tag=TAG_TEXT)]
        backoff = Backoff.streamer()
        while time.monotonic() < deadline:  # the chief aborts the job when it sees the error
            MPI.Request.Testall(reqs)
            credit.poll()
            backoff.idle()
    finally:
        sys.stderr.write(f"csrun: streamer rank {rank} (node {node}): the chief did not end the job "
                         f"within {error_grace():g} s of the error; aborting it\n")
        abort_after_output(MPI.COMM_WORLD)
