"""Opening a link to ``cs_emulator``: TCP with retries, optional TLS, the client's side of the hello.

:func:`open_link` retries while nobody listens yet and while the server answers "too many
connections", for up to ``timeout`` seconds; every other refusal is final and says what to do:
a wrong token, a busy system whose queue is full, another protocol version, a certificate the CA
file does not trust, a server that cannot prove it holds the token. Every message names the
server's address.

A system busy with another job queues this one (the hello asks for it, see
:mod:`csrun.emulator.remote.handshake`): the client logs one warning per position it is told,
saying who is ahead, when its turn is expected and how long it waits (logger
``csrun.emulator.remote.client``)::

    cs_emulator at HOST:PORT is busy with job J; queued at position 3, after 2 queued jobs (K, L); expected
    wait 6.5 min (a job here takes 2.2 min); this job waits up to 3 h (1 h per job before it: cs_emulator
    --wait-per-job)

It pings inside the server's idle limit and sleeps in ``select`` until its turn. How long it waits
is its own limit: ``queue_timeout`` seconds when given (:func:`queue_timeout`,
``CSRUN_QUEUE_TIMEOUT``; 0: not at all), else the system's allowance for each job before it, the
holder included (``cs_emulator --wait-per-job``, 1 h by default), counted from joining the queue.
Over it, it says ``bye`` and raises :class:`~csrun.emulator.remote.errors.QueueTimeout`, one line
naming the busy job, its position and what sets the limit.

How long to keep trying is :func:`connect_timeout` (``CSRUN_CONNECT_TIMEOUT`` seconds,
:mod:`csrun.env_settings`): long enough for a server that is still starting, short enough
that a wrong ``--cs_ip`` is reported within seconds. The driver opens the link before it
compiles, so a wrong address never waits for a compile.
"""

from __future__ import annotations

import logging
import math
import select
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any

from csrun.env_settings import env_name, env_settings
from csrun.address import Address
from csrun.emulator.remote import handshake, wire
from csrun.emulator.remote.errors import (
    AuthenticationFailed,
    ProtocolError,
    QueueTimeout,
    SystemBusy,
    SystemUnreachable,
    TooManyConnections,
    VersionMismatch,
)
from csrun.emulator.remote.keepalive import PING
from csrun.emulator.remote.tls import CA_ENV, ClientTLS, describe
from csrun.errors import UserError

CONNECT_TIMEOUT_ENV = env_name("connect_timeout")
QUEUE_TIMEOUT_ENV = env_name("queue_timeout")

log = logging.getLogger("csrun.emulator.remote.client")

HELLO_LIMITS = wire.Limits(max_header_bytes=16 << 10, max_tensors=0)
"""Frames of the hello are small and carry no tensors."""


@dataclass(frozen=True)
class OpenLink:
    """An authenticated connection and what the server told the client in its answer."""

    sock: socket.socket
    idle_limit: float
    """The server's idle limit in seconds (0: none); the client keeps the link busier than that."""


class _Retry(Exception):
    """An attempt failed in a way worth retrying until the deadline; ``final`` is raised then."""

    def __init__(self, final: UserError) -> None:
        super().__init__(str(final))
        self.final = final


def connect_timeout() -> float:
    """``CSRUN_CONNECT_TIMEOUT``: seconds to keep trying to reach the server (:mod:`csrun.env_settings`)."""
    return env_settings().connect_timeout


def queue_timeout() -> float | None:
    """``CSRUN_QUEUE_TIMEOUT``: seconds to wait in the queue of a busy system (None, unset: the
    system's allowance per job before this one; :mod:`csrun.env_settings`)."""
    return env_settings().queue_timeout


def open_link(host: str, port: int, token: str, job_id: str, *, timeout: float,
              tls: ClientTLS | None, wait: float | None = None) -> OpenLink:
    """Connect to ``host:port`` and authenticate as ``job_id``, retrying for up to ``timeout`` s;
    a busy system's queue is waited in for up to ``wait`` s (None: :func:`queue_timeout`, and when
    that is unset the system's allowance per job before this one)."""
    where = str(Address(host, port))
    deadline = time.monotonic() + timeout
    queue_wait = queue_timeout() if wait is None else wait
    delay = 0.05
    while True:
        try:
            return _attempt(host, port, where, token.encode(), job_id, timeout, tls, queue_wait)
        except _Retry as retry:
            if time.monotonic() + delay > deadline:
                raise retry.final from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def _attempt(host: str, port: int, where: str, token: bytes, job_id: str, timeout: float,
             tls: ClientTLS | None, queue_wait: float | None) -> OpenLink:
    try:
        raw = socket.create_connection((host, port), timeout=max(1.0, min(5.0, timeout)))
    except OSError:
        raise _Retry(SystemUnreachable(
            f"could not reach the system at {where}: nothing answered within {timeout:g} s (is cs_emulator "
            f"running there? check --cs_ip; {CONNECT_TIMEOUT_ENV} sets how long to try)")) from None
    sock: socket.socket = raw
    try:
        wire.tune_socket(raw)
        raw.settimeout(max(timeout, 10.0))
        if tls is not None:
            sock = _wrap(raw, host, where, tls)
        link = _hello(sock, where, token, job_id, tls, queue_wait)
        sock.settimeout(None)
        return link
    except BaseException:
        sock.close()
        raise


def _wrap(raw: socket.socket, host: str, where: str, tls: ClientTLS) -> ssl.SSLSocket:
    try:
        return tls.context.wrap_socket(raw, server_hostname=tls.server_name or host)
    except ssl.SSLCertVerificationError as exc:
        raise AuthenticationFailed(
            f"the system at {where} presented a certificate that {CA_ENV} does not let this client trust "
            f"({describe(exc)})") from None
    except ssl.SSLError as exc:
        raise SystemUnreachable(
            f"the TLS handshake with the system at {where} failed ({describe(exc)}): does it serve TLS "
            f"(cs_emulator --tls-cert)? Unset {CA_ENV} for a server without TLS") from None
    except (OSError, EOFError) as exc:
        raise SystemUnreachable(f"the system at {where} closed the connection during the TLS handshake "
                                f"({type(exc).__name__}: {exc})") from None


def _receive(sock: socket.socket, where: str, stage: str, tls: ClientTLS | None) -> dict[str, Any]:
    try:
        header, _ = wire.recv_frame(sock, HELLO_LIMITS)
        return header
    except (socket.timeout, TimeoutError):
        raise SystemUnreachable(f"the system at {where} did not answer {stage} in time") from None
    except ssl.SSLError as exc:
        raise SystemUnreachable(f"the TLS link to the system at {where} failed {stage} ({describe(exc)})") from None
    except (OSError, EOFError) as exc:
        hint = "" if tls is not None else (
            f"; if it serves TLS, set {CA_ENV}; if it is an older cs_emulator, use the same csrun version on both sides")
        raise SystemUnreachable(f"the system at {where} closed the connection {stage} "
                                f"({type(exc).__name__}: {exc}){hint}") from None
    except ProtocolError as exc:
        raise SystemUnreachable(f"the system at {where} does not speak the cs_emulator protocol ({exc})") from None


def _refused(header: dict[str, Any], where: str) -> UserError | _Retry:
    """The error for a refusal frame of the hello."""
    kind = header.get("kind")
    msg = str(header.get("message", "no reason given"))
    if kind == "overload":
        return _Retry(TooManyConnections(f"the system at {where} refused the connection: {msg}"))
    if kind == "busy":
        return SystemBusy(f"{msg} (the system at {where})")
    if kind == "auth":
        return AuthenticationFailed(f"{msg} (the system at {where})")
    if kind == "idle":  # dropped from the queue: this process was stopped while it waited
        return SystemBusy(f"the system at {where} dropped this job from its queue: {msg}")
    if kind == "version":
        return VersionMismatch(f"the system at {where} refused this client's protocol version "
                               f"{wire.PROTOCOL_VERSION} ({msg}): use the same csrun version on both sides")
    return SystemUnreachable(f"the system at {where} refused the connection: {msg}")


def _hello(sock: socket.socket, where: str, token: bytes, job_id: str, tls: ClientTLS | None,
           queue_wait: float | None) -> OpenLink:
    greeting = _receive(sock, where, "before greeting this client", tls)
    if greeting.get("op") == "error":
        raise _refused(greeting, where)
    version = greeting.get("version")
    if version != wire.PROTOCOL_VERSION:
        raise VersionMismatch(f"the system at {where} speaks wire protocol {version!r}, this client "
                              f"{wire.PROTOCOL_VERSION}: use the same csrun version on both sides")
    if greeting.get("op") != "challenge":
        raise SystemUnreachable(f"the system at {where} does not speak the cs_emulator protocol "
                                f"(greeting {greeting.get('op')!r})")
    try:
        server_nonce = handshake.check_nonce(greeting.get("nonce"), "server")
    except ProtocolError as exc:
        raise SystemUnreachable(f"the system at {where} sent a malformed greeting ({exc})") from None
    hello = handshake.hello(token, server_nonce, job_id)
    try:
        wire.send_frame(sock, hello)
    except OSError as exc:
        raise SystemUnreachable(f"the system at {where} closed the connection during the hello ({exc})") from None
    answer = _receive(sock, where, "during the hello", tls)
    expected = handshake.proof(token, "server", server_nonce, hello["nonce"], job_id)
    if answer.get("op") == "queued":
        answer = _wait_in_queue(sock, where, answer, expected, tls, queue_wait)
    if answer.get("op") == "error":
        refusal = _refused(answer, where)
        raise refusal.final if isinstance(refusal, _Retry) else refusal
    if answer.get("op") != "ok" or not handshake.proof_matches(expected, answer.get("proof")):
        raise _impostor(where)
    idle = answer.get("idle_limit", 0)
    idle_limit = float(idle) if isinstance(idle, (int, float)) and not isinstance(idle, bool) and idle > 0 else 0.0
    return OpenLink(sock, idle_limit)


def _impostor(where: str) -> AuthenticationFailed:
    return AuthenticationFailed(f"the system at {where} did not prove that it holds the token: it is not "
                                "the cs_emulator this token belongs to (check --cs_ip / CS_IP)")


def _number(value: Any, default: float) -> float:
    """A finite non-negative number from a frame field, else ``default``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf
    return float(value) if ok else default


def _wait_in_queue(sock: socket.socket, where: str, queued: dict[str, Any], expected: str,
                   tls: ClientTLS | None, own: float | None) -> dict[str, Any]:
    """Wait in the server's queue from its first ``queued`` frame for up to ``own`` seconds (None:
    the frame's ``wait_per_job`` for each job before this one), pinging inside its idle limit;
    returns the frame that ends the wait (``ok`` or ``error``)."""
    joined = time.monotonic()
    limit = _QueueLimit.of(queued, own)
    deadline = joined + limit.seconds
    position, busy_with, told = 0, "?", None
    last_ping = time.monotonic()
    while queued.get("op") == "queued":
        if not handshake.proof_matches(expected, queued.get("proof")):
            raise _impostor(where)  # never wait for a listener that cannot prove the token
        position = int(_number(queued.get("position"), 0))
        busy_with = str(queued.get("busy_with", "?"))
        if position != told:
            log.warning("cs_emulator at %s is busy with job %s; queued at position %d%s; %s%s", where, busy_with,
                        position, _ahead(queued, position), _expected(queued), limit.describe())
            told = position
        idle = _number(queued.get("idle_limit"), 0.0)
        interval = idle / 4 if idle else None
        while True:
            now = time.monotonic()
            if now >= deadline:
                _say_bye(sock)
                raise QueueTimeout(
                    f"cs_emulator at {where} is still busy with job {busy_with}: this job waited "
                    f"{_duration(limit.seconds)} in its queue and was at position {position}; {limit.setter()} "
                    "sets how long to wait")
            timeout: float | None = deadline - now if deadline < math.inf else None
            if interval is not None:
                timeout = min(timeout if timeout is not None else math.inf, max(0.0, last_ping + interval - now))
            buffered = isinstance(sock, ssl.SSLSocket) and sock.pending() > 0
            if buffered or select.select([sock], [], [], timeout)[0]:
                queued = _receive(sock, where, "while this job was queued", tls)
                break
            if interval is not None and time.monotonic() >= last_ping + interval:
                try:
                    wire.send_frame(sock, PING)
                except OSError as exc:
                    raise SystemUnreachable(f"the system at {where} closed the connection while this job was "
                                            f"queued ({exc})") from None
                last_ping = time.monotonic()
    return queued


@dataclass(frozen=True)
class _QueueLimit:
    """How long a queued job waits, and what says so."""

    seconds: float
    """From joining the queue (infinite: until its turn)."""
    own: bool
    """Its own limit (``CSRUN_QUEUE_TIMEOUT``, or given) rather than the system's allowance."""
    per_job: float = 0.0
    """The system's allowance per job before this one (when not ``own``)."""

    @classmethod
    def of(cls, first: dict[str, Any], own: float | None) -> "_QueueLimit":
        """The limit of a job whose first ``queued`` frame is ``first``."""
        if own is not None:
            return cls(own, True)
        per_job = _number(first.get("wait_per_job"), handshake.DEFAULT_WAIT_PER_JOB)
        before = max(1.0, _number(first.get("position"), 1.0))  # the holder and the queued jobs ahead
        return cls(before * per_job if per_job else math.inf, False, per_job)

    def describe(self) -> str:
        """``this job waits up to ...``, naming what sets it."""
        if self.seconds == math.inf:
            return "this job waits until its turn (cs_emulator --wait-per-job 0)"
        if self.own:
            return f"this job waits up to {_duration(self.seconds)} ({QUEUE_TIMEOUT_ENV})"
        return (f"this job waits up to {_duration(self.seconds)} ({_duration(self.per_job)} per job before it: "
                "cs_emulator --wait-per-job)")

    def setter(self) -> str:
        """What the job's user changes to wait longer."""
        return QUEUE_TIMEOUT_ENV if self.own else f"{QUEUE_TIMEOUT_ENV} (or the system's --wait-per-job)"


def _ahead(queued: dict[str, Any], position: int) -> str:
    """``, after 2 queued jobs (K, L)`` from a ``queued`` frame ("" at the head of the queue)."""
    if position <= 1:
        return ""
    names = [str(j) for j in queued.get("jobs_ahead") or [] if isinstance(j, str)]
    more = position - 1 - len(names)
    listed = ", ".join(names) + (f" and {more} more" if names and more > 0 else "")
    return f", after {position - 1} queued job{'s' if position > 2 else ''}" + (f" ({listed})" if names else "")


def _expected(queued: dict[str, Any]) -> str:
    """``expected wait 6.5 min (a job here takes 2.2 min); `` from a ``queued`` frame."""
    wait, job = _number(queued.get("expected_wait"), -1.0), _number(queued.get("job_time"), -1.0)
    if wait < 0 or job < 0:
        return "expected wait unknown (no job has finished on this system yet); "
    return f"expected wait {_duration(wait)} (a job here takes {_duration(job)}); "


def _duration(seconds: float) -> str:
    """``45 s``, ``6.5 min``, ``3 h``."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def _say_bye(sock: socket.socket) -> None:
    """Leave the queue politely (the server drops a closed connection from it as well)."""
    try:
        wire.send_frame(sock, {"op": "bye"})
    except OSError:
        pass
