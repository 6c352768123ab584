"""The emulator server: one authenticated client at a time drives an EmbeddedDevice over TCP.

Session protocol (frames as in :mod:`csrun.emulator.remote.wire`; the hello as in
:mod:`csrun.emulator.remote.handshake`; every request after the hello carries a ``seq`` and is
answered in order):

===================  ===========================================  ==================================
frame ``op``         fields / buffers                             answer
===================  ===========================================  ==================================
``challenge``        server -> client, first: ``version``,        the client's ``hello``
                     ``nonce``
``hello``            ``version``, ``job_id``, ``nonce``,          ``ok`` (``proof``, ``idle_limit``)
                     ``proof`` (HMAC of both nonces, job id)      or ``error`` (auth / busy / version)
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
they hold it with HMAC-SHA256 over fresh nonces, compared in constant time. While a client holds
the system, other authenticated clients get ``system busy: in use by job J since T`` and are
closed. A client that disconnects (or whose connection breaks) frees the system at once; its
device state is dropped. Malformed input closes only that connection, with a logged reason.

Limits (:mod:`csrun.emulator.remote.guard`): at most ``max_pending`` connections wait to authenticate
(a newcomer evicts the oldest stale one, else it hears ``too many connections``); each has
``hello_deadline`` seconds for its whole hello; the holder loses the system when the server has
waited ``idle_limit`` seconds for its next bytes (it is told why). With ``tls`` every connection
is TLS (:mod:`csrun.emulator.remote.tls`), the handshake inside the hello deadline.

As soon as it listens the server imports torch's program reader and starts a GPU's runtime on a
background thread (:mod:`csrun.emulator.remote.server_warmup`), so a job's first load does not wait
seconds for them.
"""

from __future__ import annotations

import datetime as _dt
import logging
import socket
import ssl
import threading
import time

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
    ) -> None:
        """Bind the listening socket. ``token`` must be non-empty (its strength is the command's
        check, :func:`csrun.emulator.remote.auth_token.check_token`). ``connection_limits``: pending
        connections, hello deadline, idle limit. ``tls``: a server context to wrap every connection."""
        if not token:
            raise UserError("the emulator needs a non-empty token")
        self._token = token.encode()
        self.device = device
        self.queue_depth = queue_depth
        self.limits = limits
        self.tls = tls
        self.guard = Guard(connection_limits)
        self.stopping = False
        self._lock = threading.Lock()
        self._active: tuple[str, str] | None = None  # (job id, since)
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
        with self._lock:
            if self._active is not None:
                job, since = self._active
                log.info("%s: job %s refused, system busy with job %s", peer, job_id, job)
                wire.send_frame(conn, handshake.refusal("busy", f"system busy: in use by job {job} since {since}"))
                return None
            since = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            self._active = (job_id, since)
        try:
            wire.send_frame(conn, {
                "op": "ok", "seq": None, "version": PROTOCOL_VERSION,
                "proof": handshake.proof(self._token, "server", server_nonce, client_nonce, job_id),
                "idle_limit": self.guard.limits.idle_limit,
            })
        except BaseException:
            with self._lock:
                self._active = None
            raise
        return job_id

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
                with self._lock:
                    self._active = None
                log.info("%s: system free", peer)
            with self._lock:
                self._conns.discard(conn)
            try:
                conn.close()
            except OSError:
                pass
