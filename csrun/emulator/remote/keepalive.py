"""Client keep-alives: a ``ping`` frame whenever the link has been quiet for a while.

The server takes the system back from a holder that keeps it waiting longer than its idle limit
(:mod:`csrun.emulator.remote.guard`), and tells the client that limit in the hello's answer. A job can be
legitimately quiet much longer than that: compiling, running step closures, evaluating on the CPU,
writing a checkpoint, or waiting on a long step. So a thread of its own sends ``{"op": "ping"}``
when nothing was sent for a quarter of the limit; only a process that is stopped or frozen as a
whole (SIGSTOP, a hung machine, a cut network) falls silent. A ping never waits behind a frame
being sent: a send in progress already shows the server that the client is alive.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

PING = {"op": "ping"}
"""The keep-alive frame's header (no ``seq``: the server does not answer it)."""


class KeepAlive:
    """Calls ``send_ping`` when nothing was sent for ``interval`` seconds, until :meth:`stop`."""

    def __init__(self, interval: float, send_ping: Callable[[], bool]) -> None:
        """``send_ping`` sends one ping unless a send is in progress; returns False once the link is gone."""
        self.interval = interval
        self._send_ping = send_ping
        self.last_sent = time.monotonic()
        self.longest_quiet = 0.0
        """The longest silence seen before a ping (long only when the whole process was stopped)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cs-emulator-keepalive", daemon=True)

    def start(self) -> None:
        """Start pinging."""
        self._thread.start()

    def sent(self) -> None:
        """Record that a frame was just sent."""
        self.last_sent = time.monotonic()

    def silent_for(self) -> float:
        """Seconds since this side last sent something."""
        return time.monotonic() - self.last_sent

    def stalled_for(self) -> float:
        """The longest silence of this side so far, the current one included."""
        return max(self.longest_quiet, self.silent_for())

    def stop(self) -> None:
        """Stop pinging (does not wait for the thread)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(min(self.interval, max(0.01, self.interval - self.silent_for()))):
            quiet = self.silent_for()
            if quiet >= self.interval:
                self.longest_quiet = max(self.longest_quiet, quiet)
                if not self._send_ping():
                    return
