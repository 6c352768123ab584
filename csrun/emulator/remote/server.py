"""The emulator server: one authenticated client at a time drives an EmbeddedDevice over TCP;
the jobs that find it busy wait in a bounded FIFO queue.

Session protocol (frames as in :mod:`csrun.emulator.remote.wire`; the hello as in
:mod:`csrun.emulator.remote.handshake`; every request after the hello carries a ``seq`` and is
answered in order):

===================  ===========================================  ==================================
frame ``op``         fields / buffers                             answer
===================  ===========================================  ==================================
``challenge``        server -> client, first: ``version``,        the client's ``hello``
                     ``nonce``
``hello``            ``version``, ``job_id``, ``nonce``,          ``ok`` (``proof``, ``idle_limit``)
                     ``proof`` (HMAC of both nonces, job id),     or ``error`` (auth / busy / version
                     ``queue`` (true: wait while busy)            / idle), after 0 or more ``queued``
``queued``           server -> client while it waits:             ``ping`` frames, or
                     ``position`` (1: next), ``ahead``,           ``bye`` when it gives up
                     ``busy_with``, ``since``, ``max_queued``,
                     ``idle_limit``, ``proof`` (as in ``ok``)
``load``             ``spec`` (ProgramSpec JSON); 1 buffer:       ``ok``
                     the ``torch.export`` archive
``step``             ``batch`` (encoded pytree) + buffers         ``result`` with ``outputs``
``state_dict``       --                                           ``result`` with ``state``
``load_state_dict``  ``state``, ``strict``, ``load_optimizer``    ``ok``
``sync``             --                                           ``ok``
``ping``             -- (no ``seq``)                              none (a keep-alive)
``bye``              --                                           (connection closes)
===================  ===========================================  ==================================

Errors come back as ``{"op": "error", "seq", "kind": "user"|"device"|"protocol"|"auth"|"busy"|
"version"|"overload"|"idle", "message", "step"?}``. The token never travels: both sides prove
they hold it with HMAC-SHA256 over fresh nonces, compared in constant time. A client that
disconnects (or whose connection breaks) frees the system at once; its device state is dropped.
Malformed input closes only that connection, with a logged reason.

The queue: while a client holds the system, another authenticated client whose hello says
``"queue": true`` joins a FIFO queue of at most ``max_queued`` jobs (``cs_emulator
--max-queued``, default 32) and hears ``{"op": "queued", "position": k, "ahead": k - 1,
"busy_with": J, "since": T, ...}``, then a new ``queued`` frame each time its position changes.
When the holder leaves, the queue's head gets the hello's ``ok`` at once (the system passes
straight to it: a newcomer never overtakes the queue) and the others move up. Only an
authenticated client of this protocol is queued (the token and the version are checked first).
A queued client sends ``ping`` frames, as a holder does, and is dropped from the queue (told
why, kind ``idle``) after ``idle_limit`` seconds of silence; one that sends ``bye`` or
disconnects leaves the queue, and those behind it move up. Its thread sleeps in ``select`` on
its connection and on a wake-up socket the server writes to when the queue moves: a queue
that does not move costs no CPU. When the queue is full, a newcomer is refused (kind ``busy``)
with ``system busy: in use by job J since T, and its queue is full (N jobs waiting ...)``; a
client that does not ask to be queued (protocol 2 before the queue) hears ``system busy: in
use by job J since T`` as before.

Each ``queued`` frame also says what is ahead (``handshake.QueueOutlook``): the queued jobs before
it (``jobs_ahead``, the first few), ``job_time`` (how long the last jobs that finished here held the
system, on average; null before one has) and ``expected_wait`` (what is left of the holder's time at
that average, plus that average for each job ahead; null without it), and ``wait_per_job``, the
operator's allowance (``cs_emulator --wait-per-job``, default 1 h; 0: none): a job that sets no limit
of its own waits up to that long for each job before it, the holder included, so a long queue of
real jobs is waited through. A job's own limit is ``CSRUN_QUEUE_TIMEOUT``
(:mod:`csrun.emulator.remote.connect`); over its limit the job says ``bye``.

Limits (:mod:`csrun.emulator.remote.guard`): at most ``max_pending`` connections wait to authenticate
(a newcomer evicts the oldest stale one, else it hears ``too many connections``); each has
``hello_deadline`` seconds for its whole hello; the holder loses the system when the server has
waited ``idle_limit`` seconds for its next bytes (it is told why); a queued job is off the pending
table, under the same idle limit. With ``tls`` every connection is TLS
(:mod:`csrun.emulator.remote.tls`), the handshake inside the hello deadline.

As soon as it listens the server imports torch's program reader and starts a GPU's runtime on a
background thread (:mod:`csrun.emulator.remote.server_warmup`), so a job's first load does not wait
seconds for them.
"""

from __future__ import annotations

import datetime as _dt
import logging
import select
import socket
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from csrun.emulator.remote.log_limit import LimitedWarnings
from csrun.emulator.remote import handshake, server_warmup, wire
from csrun.emulator.remote.errors import ProtocolError
from csrun.emulator.remote.guard import Guard, GuardLimits, Pending, cut
from csrun.emulator.remote.session import Session
from csrun.errors import UserError

log = logging.getLogger("csrun.emulator.remote.server")

PROTOCOL_VERSION = wire.PROTOCOL_VERSION
HELLO_LIMITS = wire.Limits(max_header_bytes=16 << 10, max_tensors=0)
"""A hello frame is small and carries no tensors."""
MAX_REFUSALS = 8
"""TLS refusals ("too many connections") delivered at once; beyond that a connection is just closed."""
REFUSAL_SECONDS = 2.0
"""Most time a TLS refusal may take (handshake and the error frame)."""
JOB_TIMES_KEPT = 16
"""Finished jobs whose time on the system the expected wait averages (the latest ones)."""
JOBS_AHEAD_SHOWN = 8
"""Queued jobs ahead a ``queued`` frame names (the next ones); ``ahead`` counts them all."""


def _now_utc() -> str:
    """The time a job took the system, as the busy refusal and the ``queued`` frame show it."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(eq=False)
class _Waiter:
    """An authenticated job waiting in the queue; its thread sleeps in ``select`` on its
    connection and on ``wake`` (a socket pair), which the server writes to when the queue moves."""

    job_id: str
    peer: str
    wake_r: socket.socket = field(init=False)
    wake_w: socket.socket = field(init=False)
    admitted: bool = False
    """The system is this job's (set by the server under its lock, when the job left the queue's head)."""
    turns: int = 0
    """Times its thread woke (a queue that does not move wakes it never)."""

    def __post_init__(self) -> None:
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_w.setblocking(False)
        self.wake_r.setblocking(False)

    def wake(self) -> None:
        """Tell its thread to look at the queue again (never blocks)."""
        try:
            self.wake_w.send(b"\0")
        except OSError:  # the pair is full (it will look anyway) or already closed
            pass

    def drain(self) -> None:
        """Read the wake-ups that arrived."""
        try:
            while self.wake_r.recv(4096):
                pass
        except OSError:
            pass

    def close(self) -> None:
        self.wake_r.close()
        self.wake_w.close()


class EmulatorServer:
    """A ``cs_emulator`` server bound to ``host:port`` (port 0 picks a free one)."""

    def __init__(
        self,
        *,
        token: str,
        host: str = "127.0.0.1",
        port: int = 9000,
        device: str = "cpu",
        queue_depth: int = 2,
        limits: wire.Limits = wire.Limits(),
        connection_limits: GuardLimits = GuardLimits(),
        tls: ssl.SSLContext | None = None,
        wait_per_job: float = handshake.DEFAULT_WAIT_PER_JOB,
    ) -> None:
        """Bind the listening socket. ``token`` must be non-empty (its strength is the command's
        check, :func:`csrun.emulator.remote.auth_token.check_token`). ``connection_limits``: pending
        connections, hello deadline, idle limit, queue size. ``tls``: a server context to wrap every
        connection. ``wait_per_job``: seconds a queued job with no limit of its own waits per job
        before it (0: no limit; told to it in each ``queued`` frame)."""
        if not token:
            raise UserError("the emulator needs a non-empty token")
        if not wait_per_job >= 0:
            raise UserError(f"wait_per_job must be >= 0 seconds (0: no limit), got {wait_per_job}")
        self.wait_per_job = wait_per_job
        self._token = token.encode()
        self.device = device
        self.queue_depth = queue_depth
        self.limits = limits
        self.tls = tls
        self.guard = Guard(connection_limits)
        self.stopping = False
        self._lock = threading.Lock()
        self._active: tuple[str, str] | None = None  # (job id, since)
        self._held_from = 0.0  # time.monotonic() when the holder took the system
        self._job_times: deque[float] = deque(maxlen=JOB_TIMES_KEPT)  # how long finished jobs held it
        self._queue: list[_Waiter] = []  # FIFO; never waiting while the system is free
        self._conns: set[socket.socket] = set()
        self._refusers = threading.Semaphore(MAX_REFUSALS)
        self._refused = 0
        self._refused_logged = 0.0
        self.warnings = LimitedWarnings(log)
        """Warnings about clients (wrong tokens, bad frames), rate-limited per kind."""
        self._threads: list[threading.Thread] = []
        self._sock = socket.create_server((host, port), reuse_port=False)
        self._sock.settimeout(0.2)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]

    @property
    def busy_with(self) -> tuple[str, str] | None:
        """(job id, since) of the client holding the system, or None."""
        return self._active

    @property
    def queued(self) -> list[str]:
        """The job ids waiting in the queue, the next one first."""
        with self._lock:
            return [w.job_id for w in self._queue]

    def _free(self, *, ran: bool = True) -> str | None:
        """The holder is gone (``ran``: it held the system for its job, which counts in the jobs'
        time): the system goes to the queue's head, if any (its job id)."""
        with self._lock:
            if ran and self._active is not None:
                self._job_times.append(time.monotonic() - self._held_from)
            self._active = None
            self._hand_over()
            return self._active[0] if self._active is not None else None

    def _take(self, job_id: str) -> None:
        """With the lock held: ``job_id`` holds the system from now."""
        self._active = (job_id, _now_utc())
        self._held_from = time.monotonic()

    def _hand_over(self) -> None:
        """With the lock held: a free system goes to the queue's head; every waiter looks again."""
        if self._active is None and self._queue:
            head = self._queue.pop(0)
            head.admitted = True
            self._take(head.job_id)
            head.wake()
        for w in self._queue:
            w.wake()

    def _outlook(self, position: int) -> handshake.QueueOutlook:
        """With the lock held: what the job at ``position`` is told of the jobs before it."""
        ahead = tuple(w.job_id for w in self._queue[:min(position - 1, JOBS_AHEAD_SHOWN)])
        if not self._job_times:
            return handshake.QueueOutlook(jobs_ahead=ahead, wait_per_job=self.wait_per_job)
        job_time = sum(self._job_times) / len(self._job_times)
        held = time.monotonic() - self._held_from if self._active is not None else 0.0
        expected = max(0.0, job_time - held) + (position - 1) * job_time
        return handshake.QueueOutlook(jobs_ahead=ahead, expected_wait=round(expected, 1),
                                      job_time=round(job_time, 1), wait_per_job=self.wait_per_job)

    def serve_forever(self) -> None:
        """Accept connections until :meth:`shutdown`."""
        log.info("listening on %s:%d (device %s%s)", self.address[0], self.address[1], self.device,
                 ", TLS" if self.tls else "")
        self.guard.start()
        server_warmup.warm_up(self.device)  # the program reader and a GPU's runtime, while the chief compiles
        try:
            while not self.stopping:
                try:
                    conn, addr = self._sock.accept()
                except (TimeoutError, socket.timeout):
                    continue
                except OSError as exc:
                    if self.stopping:
                        break
                    log.warning("accept failed (%s); retrying", exc)  # e.g. out of file descriptors
                    time.sleep(0.1)
                    continue
                self._admit(conn, f"{addr[0]}:{addr[1]}")
        finally:
            self.guard.stop()
            self._sock.close()

    def _admit(self, conn: socket.socket, peer: str) -> None:
        """Start serving a new connection, or refuse it when the pending table is full."""
        if self.tls is not None:
            conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        entry = self.guard.admit(conn, peer)
        if entry is None:
            self._refuse(conn, peer)
            return
        t = threading.Thread(target=self._serve_conn, args=(conn, peer, entry), name="cs-emulator-conn", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()]
        self._threads.append(t)
        t.start()

    def _refuse(self, conn: socket.socket, peer: str) -> None:
        """Tell a connection over the limit so, without a thread when there is no TLS."""
        limit = self.guard.limits.max_pending
        frame = handshake.refusal("overload", f"too many connections: {limit} are waiting to authenticate, "
                                              "the most this system admits; try again shortly")
        self._refused += 1
        now = time.monotonic()
        if now - self._refused_logged >= 1.0:
            log.warning("%s: refused, too many connections waiting to authenticate (%d refused so far)",
                        peer, self._refused)
            self._refused_logged = now
        if self.tls is None:
            try:
                conn.setblocking(False)
                wire.send_frame(conn, frame)  # the server speaks first: nothing unread, no reset
            except OSError:
                pass
            conn.close()
            return
        if not self._refusers.acquire(blocking=False):
            conn.close()
            return
        entry = self.guard.watch_refusal(conn, peer, REFUSAL_SECONDS)

        def deliver() -> None:
            try:
                conn.settimeout(REFUSAL_SECONDS)
                conn.do_handshake()  # type: ignore[attr-defined]  # an ssl.SSLSocket when serving TLS
                wire.send_frame(conn, frame)
            except (OSError, ValueError):
                pass
            finally:
                self.guard.release(entry)
                conn.close()
                self._refusers.release()

        threading.Thread(target=deliver, name="cs-emulator-refuse", daemon=True).start()

    def start(self) -> threading.Thread:
        """Serve on a background thread (tests, embedding); returns the thread."""
        t = threading.Thread(target=self.serve_forever, name="cs-emulator-accept", daemon=True)
        t.start()
        return t

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop accepting, drop every connection, wait for their threads."""
        self.stopping = True
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            cut(c)
        for t in list(self._threads):
            t.join(timeout)
        self.guard.stop()

    def _hello(self, conn: socket.socket, peer: str, entry: Pending) -> str | None:
        """Greet, check the client's proof, claim the system; returns the job id, or None after
        answering and logging a refusal."""
        server_nonce = handshake.new_nonce()
        wire.send_frame(conn, handshake.greeting(server_nonce))
        header, _ = wire.recv_frame(conn, HELLO_LIMITS)
        if header.get("op") != "hello":
            raise ProtocolError("the first frame must be hello")
        version = header.get("version")
        if version != PROTOCOL_VERSION:
            self.warnings.warning("version", "%s: refused a client speaking wire protocol %r (this server speaks %d)",
                                  peer, version, PROTOCOL_VERSION)
            wire.send_frame(conn, handshake.refusal(
                "version", f"this cs_emulator speaks wire protocol {PROTOCOL_VERSION}, the client {version!r}: "
                           "use the same csrun version on both sides"))
            return None
        job_id = handshake.check_job_id(header.get("job_id"))
        client_nonce = handshake.check_nonce(header.get("nonce"), "client")
        expected = handshake.proof(self._token, "client", server_nonce, client_nonce, job_id)
        if not handshake.proof_matches(expected, header.get("proof")):
            self.warnings.warning("auth", "%s: authentication failed (wrong token) for job %r", peer, job_id)
            wire.send_frame(conn, handshake.refusal(
                "auth", "authentication failed: the token does not match this system's"))
            return None
        self.guard.release(entry)  # authenticated: off the pending table and its deadline
        server_proof = handshake.proof(self._token, "server", server_nonce, client_nonce, job_id)
        waiter: _Waiter | None = None
        with self._lock:
            if self._active is None and not self._queue:
                self._take(job_id)
            else:
                refusal = self._busy_refusal(header.get("queue") is True)
                if refusal is not None:
                    log.info("%s: job %s refused, system busy with job %s (%d queued)", peer, job_id,
                             self._active[0] if self._active else "?", len(self._queue))
                    wire.send_frame(conn, handshake.refusal("busy", refusal))
                    return None
                waiter = _Waiter(job_id, peer)
                self._queue.append(waiter)
        try:
            if waiter is not None and not self._wait_in_queue(conn, peer, waiter, server_proof):
                if waiter.admitted:  # it left just as its turn came
                    self._free(ran=False)
                return None
            wire.send_frame(conn, {
                "op": "ok", "seq": None, "version": PROTOCOL_VERSION, "proof": server_proof,
                "idle_limit": self.guard.limits.idle_limit,
            })
        except BaseException:
            if waiter is None or waiter.admitted:
                self._free(ran=False)
            raise
        return job_id

    def _busy_refusal(self, can_queue: bool) -> str | None:
        """With the lock held and the system busy: why a newcomer is refused, or None to queue it."""
        job, since = self._active if self._active is not None else ("?", "?")
        busy = f"system busy: in use by job {job} since {since}"
        limit = self.guard.limits.max_queued
        if not can_queue:
            return busy  # a client of protocol 2 without the queue
        if limit == 0:
            return f"{busy}, and this system queues no jobs (cs_emulator --max-queued 0); try again later"
        if len(self._queue) >= limit:
            return (f"{busy}, and its queue is full ({limit} job{'s' if limit != 1 else ''} waiting, the most it "
                    "queues: cs_emulator --max-queued); try again later")
        return None

    def _wait_in_queue(self, conn: socket.socket, peer: str, waiter: _Waiter, server_proof: str) -> bool:
        """Keep ``waiter`` in the queue until it is admitted (True) or leaves it (False): it hears
        a ``queued`` frame whenever its position changes, and its pings are read. It sleeps in
        ``select`` meanwhile; a silence over the idle limit drops it (it is told why)."""
        idle_limit = self.guard.limits.idle_limit
        told: int | None = None
        heard = time.monotonic()
        try:
            while not self.stopping:
                with self._lock:
                    if waiter.admitted:
                        return True
                    position = self._queue.index(waiter) + 1
                    job, since = self._active if self._active is not None else ("?", "?")
                    outlook = self._outlook(position) if position != told else None
                if outlook is not None:
                    log.info("job %s (%s) queued at position %d, the system busy with job %s", waiter.job_id,
                             peer, position, job)
                    wire.send_frame(conn, handshake.queued(position, job, since, self.guard.limits.max_queued,
                                                           idle_limit, server_proof, outlook))
                    told = position
                buffered = isinstance(conn, ssl.SSLSocket) and conn.pending() > 0
                timeout = 0.0 if buffered else None if not idle_limit else max(0.0, heard + idle_limit - time.monotonic())
                ready, _, _ = select.select([conn, waiter.wake_r], [], [], timeout)
                waiter.turns += 1
                if waiter.wake_r in ready:
                    waiter.drain()
                if conn in ready or buffered:
                    try:
                        header, _ = wire.recv_frame(conn, HELLO_LIMITS)
                    except (EOFError, ConnectionError) as exc:
                        if not self.stopping:
                            log.info("job %s (%s) left the queue (%s)", waiter.job_id, peer, exc or type(exc).__name__)
                        return False
                    heard = time.monotonic()
                    if header.get("op") == "bye":
                        log.info("job %s (%s) left the queue", waiter.job_id, peer)
                        return False
                    if header.get("op") != "ping":
                        raise ProtocolError(f"a queued client may send ping or bye, not {header.get('op')!r}")
                elif idle_limit and time.monotonic() - heard >= idle_limit:
                    why = (f"job {waiter.job_id} sent nothing for {time.monotonic() - heard:.1f}s while queued, over "
                           f"this system's idle limit of {idle_limit:g}s: it was dropped from the queue")
                    log.warning("job %s (%s): %s", waiter.job_id, peer, why)
                    self._leave(waiter)  # off the queue first, then told
                    wire.send_frame(conn, handshake.refusal("idle", why))
                    return False
            return False
        finally:
            self._leave(waiter)
            waiter.close()

    def _leave(self, waiter: _Waiter) -> None:
        """``waiter`` is off the queue (if still on it); the ones behind it move up."""
        with self._lock:
            if waiter in self._queue:
                self._queue.remove(waiter)
                self._hand_over()

    def _serve_conn(self, conn: socket.socket, peer: str, entry: Pending) -> None:
        with self._lock:
            self._conns.add(conn)
        session: Session | None = None
        job_id: str | None = None
        try:
            conn.settimeout(self.guard.limits.hello_deadline)  # per operation; the guard holds the deadline
            if isinstance(conn, ssl.SSLSocket):
                conn.do_handshake()
            job_id = self._hello(conn, peer, entry)
            if job_id is None:
                return
            conn.settimeout(None)
            wire.tune_socket(conn)
            log.info("job %s (%s) holds the system", job_id, peer)
            session = Session(conn, peer, job_id, device=self.device, queue_depth=self.queue_depth,
                              limits=self.limits, idle_limit=self.guard.limits.idle_limit,
                              stopping=lambda: self.stopping)
            self.guard.hold(session)
            session.run()
        except (ProtocolError, EOFError, OSError, TimeoutError, ValueError) as exc:
            reason = entry.reason or (f"TLS handshake failed ({exc})" if isinstance(exc, ssl.SSLError)
                                      else exc or type(exc).__name__)
            self.warnings.warning("closing", "%s: closing the connection: %s", peer, reason)
        except Exception:  # noqa: BLE001 - never take the server down
            log.exception("%s: closing the connection after an internal error", peer)
        finally:
            self.guard.release(entry)
            if session is not None:
                self.guard.hold(None)
            if job_id is not None:
                nxt = self._free()
                log.info("%s: system free%s", peer, f", job {nxt} is next" if nxt is not None else "")
            with self._lock:
                self._conns.discard(conn)
            try:
                conn.close()
            except OSError:
                pass
