"""``cstorch.utils.tracker.RateTracker``: samples per second, recent and overall.

``add(n)`` counts ``n`` samples as done now. :attr:`~RateTracker.rate` is the rate since the
previous ``add``, :attr:`~RateTracker.global_rate` the rate since the tracker started (its
first ``add`` or :meth:`~RateTracker.reset`), :attr:`~RateTracker.total_samples` and
:attr:`~RateTracker.total_time` what that is made of.
"""

from __future__ import annotations

import time


class RateTracker:
    """Counts samples over time (see the module manual)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start again from now."""
        self._start = time.monotonic()
        self._last = self._start
        self.total_samples = 0
        """Samples counted since the start."""
        self._rate = 0.0

    def add(self, count: int) -> None:
        """``count`` samples are done now."""
        now = time.monotonic()
        elapsed = now - self._last
        self._rate = count / elapsed if elapsed > 0 else 0.0
        self._last = now
        self.total_samples += int(count)

    @property
    def total_time(self) -> float:
        """Seconds from the start to the last ``add``."""
        return self._last - self._start

    @property
    def rate(self) -> float:
        """Samples per second since the previous ``add``."""
        return self._rate

    @property
    def global_rate(self) -> float:
        """Samples per second since the start."""
        return self.total_samples / self.total_time if self.total_time > 0 else 0.0


__all__ = ["RateTracker"]
