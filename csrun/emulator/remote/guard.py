"""The server's limits on connections, enforced by one watchdog thread.

- **Pending connections** (accepted, not yet authenticated) are at most ``max_pending``. When the
  table is full, a newcomer evicts the oldest pending connection if that one is older than
  ``evict_after`` (a real client finishes its hello in one round trip; a slow-loris connection
  does not), else the newcomer is refused with "too many connections".
- **The hello deadline**: a pending connection has ``hello_deadline`` seconds for the whole hello
  (TLS handshake included), however it trickles its bytes; then it is cut.
- **The holder's idle limit**: while the server waits for the holder's next bytes, the wait may
  last at most ``idle_limit`` seconds (clients send keep-alives when they have nothing else to
  say, see :mod:`csrun.emulator.remote.keepalive`). Time the server spends working (a step, a load, a
  state fetch) does not count. A holder over the limit is handed to its ``reclaim``.
- **The queue** (``max_queued`` jobs) is the server's (:mod:`csrun.emulator.remote.server`): a
  queued connection has left the pending table, and its own thread holds it to the idle limit.

Cutting a connection means ``shutdown(SHUT_RDWR)`` on its socket (the plain socket's, also under
TLS), which wakes the thread blocked on it; that thread cleans up as after any lost link.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from csrun.errors import UserError

log = logging.getLogger("csrun.emulator.remote.server")


@dataclass(frozen=True, kw_only=True)
class GuardLimits:
    """The limits a :class:`Guard` enforces."""

    max_pending: int = 64
    """Connections at once that have not authenticated yet."""
    hello_deadline: float = 5.0
    """Seconds for the whole hello of a connection (TLS handshake, challenge, answer)."""
    idle_limit: float = 60.0
    """Seconds the holder may keep the server waiting for its next bytes; 0 for no limit."""
    max_queued: int = 32
    """Authenticated jobs at once that wait in the queue for a busy system (0: none; a job that
    finds the system busy is refused at once)."""
    evict_after: float | None = None
    """Age after which a pending connection gives its place to a newcomer when the table is full
    (default: the smaller of 1 s and half the hello deadline)."""

    @property
    def eviction_age(self) -> float:
        """:attr:`evict_after`, or its default."""
        return self.evict_after if self.evict_after is not None else min(1.0, self.hello_deadline / 2)


def cut(conn: socket.socket) -> None:
    """Shut both directions of ``conn`` down now (for TLS, the socket under it), ignoring errors."""
    try:
        socket.socket.shutdown(conn, socket.SHUT_RDWR)
    except OSError:
        pass


@dataclass(eq=False)
class Pending:
    """One accepted connection that has not authenticated yet."""

    conn: socket.socket
    peer: str
    accepted: float
    deadline: float
    counted: bool = True
    """Holds a place in the pending table (False for refusals being delivered)."""
    reason: str | None = field(default=None)
    """Why the guard cut it (None while it has not)."""


class Holder(Protocol):
    """The session holding the system, as the watchdog sees it."""

    def idle_for(self) -> float | None:
        """Seconds the server has been waiting for the holder's next bytes (None: not waiting)."""

    def reclaim(self, idle: float) -> None:
        """Take the system back after ``idle`` seconds of silence (close the connection)."""


class Guard:
    """The pending-connection table, hello deadlines and the holder's idle limit, with its watchdog."""

    def __init__(self, limits: GuardLimits) -> None:
        """Check ``limits``; :meth:`start` runs the watchdog."""
        if limits.max_pending < 1:
            raise UserError(f"max_pending must be >= 1, got {limits.max_pending}")
        if not limits.hello_deadline > 0:
            raise UserError(f"hello_deadline must be > 0, got {limits.hello_deadline}")
        if not limits.idle_limit >= 0:
            raise UserError(f"idle_limit must be >= 0, got {limits.idle_limit}")
        if limits.max_queued < 0:
            raise UserError(f"max_queued must be >= 0, got {limits.max_queued}")
        self.limits = limits
        self._lock = threading.Lock()
        self._pending: list[Pending] = []
        self._holder: Holder | None = None
        self._stop = threading.Event()
        ticks = [0.25, limits.hello_deadline / 5]
        if limits.idle_limit:
            ticks.append(limits.idle_limit / 5)
        self.tick = max(0.01, min(ticks))
        self._thread = threading.Thread(target=self._watch, name="cs-emulator-watchdog", daemon=True)

    def start(self) -> None:
        """Run the watchdog thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the watchdog thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    @property
    def pending(self) -> int:
        """Connections holding a place in the pending table."""
        with self._lock:
            return sum(1 for p in self._pending if p.counted)

    def admit(self, conn: socket.socket, peer: str) -> Pending | None:
        """A place for a new connection, evicting the oldest stale one when full; None: refuse it."""
        now = time.monotonic()
        victim = None
        with self._lock:
            counted = [p for p in self._pending if p.counted]
            if len(counted) >= self.limits.max_pending:
                oldest = min(counted, key=lambda p: p.accepted)
                if now - oldest.accepted < self.limits.eviction_age:
                    return None
                self._pending.remove(oldest)
                oldest.reason = f"evicted after {now - oldest.accepted:.1f}s to admit {peer} (pending table full)"
                victim = oldest
            entry = Pending(conn, peer, now, now + self.limits.hello_deadline)
            self._pending.append(entry)
        if victim is not None:
            log.warning("%s: %s", victim.peer, victim.reason)
            cut(victim.conn)
        return entry

    def watch_refusal(self, conn: socket.socket, peer: str, seconds: float) -> Pending:
        """Give a refusal being delivered (outside the table) ``seconds`` before it is cut."""
        now = time.monotonic()
        entry = Pending(conn, peer, now, now + seconds, counted=False)
        with self._lock:
            self._pending.append(entry)
        return entry

    def release(self, entry: Pending) -> None:
        """The connection authenticated or ended: it leaves the table and its deadline is off."""
        with self._lock:
            if entry in self._pending:
                self._pending.remove(entry)

    def hold(self, holder: Holder | None) -> None:
        """Watch ``holder``'s idle time (None: nobody holds the system)."""
        with self._lock:
            self._holder = holder

    def _watch(self) -> None:
        while not self._stop.wait(self.tick):
            now = time.monotonic()
            with self._lock:
                late = [p for p in self._pending if now >= p.deadline]
                for p in late:
                    self._pending.remove(p)
                    p.reason = f"the hello deadline of {self.limits.hello_deadline:g}s passed"
                holder = self._holder
            for p in late:
                log.warning("%s: %s; closing", p.peer, p.reason)
                cut(p.conn)
            if holder is not None and self.limits.idle_limit:
                idle = holder.idle_for()
                if idle is not None and idle >= self.limits.idle_limit:
                    with self._lock:
                        if self._holder is holder:
                            self._holder = None
                        else:
                            continue
                    try:
                        holder.reclaim(idle)
                    except Exception:  # noqa: BLE001 - the watchdog must keep watching
                        log.exception("reclaiming the system failed")


class WatchedSocket:
    """The holder's socket, timing how long each receive waits for the client (see :class:`Holder`)."""

    def __init__(self, conn: socket.socket) -> None:
        """Wrap ``conn`` (plain or TLS)."""
        self.conn = conn
        self.waiting_since: float | None = None

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        """Receive, recording when the wait began."""
        self.waiting_since = time.monotonic()
        try:
            return self.conn.recv_into(buffer, nbytes)
        finally:
            self.waiting_since = None

    def sendall(self, data: Any) -> None:
        """Send all of ``data``."""
        self.conn.sendall(data)

    def idle_for(self) -> float | None:
        """Seconds the current receive has been waiting, or None when none is waiting."""
        since = self.waiting_since
        return None if since is None else time.monotonic() - since
