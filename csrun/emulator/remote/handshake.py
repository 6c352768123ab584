"""The hello: HMAC-SHA256 challenge-response between ``cs_emulator`` and a client.

The token never travels. The exchange (frames as in :mod:`csrun.emulator.remote.wire`)::

    server -> client  {"op": "challenge", "version": 2, "nonce": Ns, "message": ...}
    client -> server  {"op": "hello", "version": 2, "job_id": J, "nonce": Nc,
                       "proof": HMAC(token, "csrun-emulator/2 client" | Ns | Nc | J)}
    client -> server  {"op": "hello", "version": 2, "job_id": J, "nonce": Nc, "queue": true,
                       "proof": HMAC(token, "csrun-emulator/2 client" | Ns | Nc | J)}
    server -> client  {"op": "queued", "version": 2, "position": k, "ahead": k - 1, "busy_with": J0,
                       "since": T, "max_queued": N, "idle_limit": S, "jobs_ahead": [J1, ...],
                       "expected_wait": W | null, "job_time": D | null, "wait_per_job": P,
                       "proof": <as in ok>}   (0 or more)
    server -> client  {"op": "ok", "version": 2, "idle_limit": S,
                       "proof": HMAC(token, "csrun-emulator/2 server" | Ns | Nc | J)}
                   or {"op": "error", "version": 2, "kind": "auth" | "busy" | "version" | "idle" | ..., "message"}

``"queue": true`` in the hello says that the client can wait in the server's queue for a busy
system; a client that does not say so (an earlier csrun speaking protocol 2) is refused with
"busy" as before, so the queue extends protocol 2 and both ends stay compatible with it. A queued
client hears a ``queued`` frame when it joins the queue and again whenever its position changes;
it sends ``ping`` frames (within the ``idle_limit`` the frame names) while it waits, and ``bye``
when it gives up. Each ``queued`` frame carries the server's proof, so a client waits only for a
server that holds the token. The wait ends in the ``ok`` (the system is the client's) or an
``error``; the server's module manual (:mod:`csrun.emulator.remote.server`) has the queue's rules.

Nonces are 32 random bytes (hex) from :mod:`secrets`, fresh per connection on both sides, so a
recorded exchange cannot be replayed and neither side can be made to sign a value of the other's
choosing alone. The server proves it knows the token too (mutual authentication): a client never
uploads a program to a listener that merely accepted the connection. The server speaks first, so a
connection it refuses ("too many connections") hears why before the client has sent a byte.

A passive observer sees both nonces, the job id and the two proofs: enough to test guesses of the
token offline, which is why ``cs_emulator`` refuses short or repetitive tokens. Without TLS an
on-path attacker can still read or take over an authenticated session (see README, Security).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from csrun.emulator.remote.errors import ProtocolError
from csrun.emulator.remote.wire import PROTOCOL_VERSION

NONCE_BYTES = 32
"""Random bytes in each side's nonce."""
MAX_JOB_ID_CHARS = 256
"""Longest job id a hello may carry."""
_DOMAIN = f"csrun-emulator/{PROTOCOL_VERSION}"

GREETING_MESSAGE = (
    f"cs_emulator speaks wire protocol {PROTOCOL_VERSION} (challenge-response hello); "
    "this client is older: use the same csrun version on both sides"
)
"""Carried in the greeting: a client of protocol 1 reads the greeting as its hello's answer and shows this."""


def new_nonce() -> str:
    """A fresh nonce (hex)."""
    return secrets.token_hex(NONCE_BYTES)


def check_nonce(value: Any, who: str) -> str:
    """``value`` if it is a well-formed nonce (hex of :data:`NONCE_BYTES` bytes); else ProtocolError."""
    if not isinstance(value, str) or len(value) != 2 * NONCE_BYTES:
        raise ProtocolError(f"the {who}'s nonce is malformed")
    try:
        bytes.fromhex(value)
    except ValueError:
        raise ProtocolError(f"the {who}'s nonce is not hex") from None
    return value


def check_job_id(value: Any) -> str:
    """``value`` if it is a usable job id (a non-empty printable string of at most 256 characters:
    it reaches other jobs' terminals, in the queue's messages, and the server's log)."""
    if not isinstance(value, str) or not value or len(value) > MAX_JOB_ID_CHARS or not value.isprintable():
        raise ProtocolError(f"hello needs a job_id string of 1 to {MAX_JOB_ID_CHARS} printable characters")
    return value


def proof(token: bytes, role: str, server_nonce: str, client_nonce: str, job_id: str) -> str:
    """HMAC-SHA256 (hex) by ``role`` (``client`` or ``server``) over both nonces and the job id."""
    msg = "\0".join((_DOMAIN, role, server_nonce, client_nonce, job_id)).encode()
    return hmac.new(token, msg, hashlib.sha256).hexdigest()


def proof_matches(expected: str, given: Any) -> bool:
    """Constant-time comparison of a received proof with the expected one."""
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())


def greeting(server_nonce: str) -> dict[str, Any]:
    """The server's first frame on a connection it accepts."""
    return {"op": "challenge", "version": PROTOCOL_VERSION, "nonce": server_nonce, "message": GREETING_MESSAGE}


def refusal(kind: str, message: str) -> dict[str, Any]:
    """An error frame of the hello (``kind``: auth, busy, version, overload, idle)."""
    return {"op": "error", "seq": None, "version": PROTOCOL_VERSION, "kind": kind, "message": message}


DEFAULT_WAIT_PER_JOB = 3600.0
"""Seconds a queued job that sets no limit of its own waits per job before it (``cs_emulator --wait-per-job``)."""


@dataclass(frozen=True, kw_only=True)
class QueueOutlook:
    """What a queued job is told of the jobs before it, besides its position."""

    jobs_ahead: tuple[str, ...] = ()
    """The queued jobs ahead of it, the next one first (the first few)."""
    expected_wait: float | None = None
    """Seconds until its turn, as the jobs that ran here took (None: no job has finished yet)."""
    job_time: float | None = None
    """Seconds the jobs that finished here held the system, on average (None: none has)."""
    wait_per_job: float = DEFAULT_WAIT_PER_JOB
    """Seconds a job with no limit of its own waits per job before it, the holder included (0: no limit)."""


def queued(position: int, busy_with: str, since: str, max_queued: int, idle_limit: float,
           server_proof: str, outlook: QueueOutlook = QueueOutlook()) -> dict[str, Any]:
    """The server's word to a queued client: its ``position`` (1: next), who holds the system since
    when, the queue's size, the idle limit its keep-alives must stay inside, the jobs ahead and
    their expected time (``outlook``), and the server's proof."""
    return {"op": "queued", "seq": None, "version": PROTOCOL_VERSION, "position": position,
            "ahead": position - 1, "busy_with": busy_with, "since": since, "max_queued": max_queued,
            "idle_limit": idle_limit, "jobs_ahead": list(outlook.jobs_ahead), "expected_wait": outlook.expected_wait,
            "job_time": outlook.job_time, "wait_per_job": outlook.wait_per_job, "proof": server_proof}


def hello(token: bytes, server_nonce: str, job_id: str, *, queue: bool = True) -> dict[str, Any]:
    """The client's hello answering a greeting with ``server_nonce``; ``queue``: the client waits
    in the queue of a busy system (else it is refused with "busy")."""
    client_nonce = new_nonce()
    frame = {"op": "hello", "version": PROTOCOL_VERSION, "job_id": job_id, "nonce": client_nonce,
             "proof": proof(token, "client", server_nonce, client_nonce, job_id)}
    if queue:
        frame["queue"] = True
    return frame
