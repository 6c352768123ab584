"""Warnings about hostile or broken clients, rate-limited so a flood cannot grow the log.

A wrong-token guesser or a stream of garbage frames would otherwise write one line per attempt
(a flood grew the log by ~12 kB/s). :class:`LimitedWarnings` writes the first :attr:`burst`
warnings of a kind as they come, then at most one per :attr:`every_s` seconds, saying how many
like it were left out since the last one written.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field


@dataclass
class LimitedWarnings:
    """Per-kind rate limit on ``log.warning`` (see the module manual)."""

    log: logging.Logger
    burst: int = 5
    """Warnings of a kind written before the limit applies."""
    every_s: float = 10.0
    """Then at most one of that kind per this many seconds."""
    _seen: dict[str, list[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def warning(self, kind: str, message: str, *args: object) -> bool:
        """Write ``message % args`` unless the kind is over its limit; True when it was written."""
        now = time.monotonic()
        with self._lock:
            count, last, dropped = self._seen.get(kind, [0.0, -1e18, 0.0])
            if count < self.burst or now - last >= self.every_s:
                self._seen[kind] = [count + 1, now, 0.0]
                suffix = f" ({int(dropped)} more like this in the last {now - last:.0f} s)" if dropped else ""
                self.log.warning(message + suffix, *args)
                return True
            self._seen[kind] = [count + 1, last, dropped + 1]
            return False


__all__ = ["LimitedWarnings"]
