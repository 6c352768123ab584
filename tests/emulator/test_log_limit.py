"""The server's rate-limited warnings: a burst, then one per interval saying how many were left out."""

from __future__ import annotations

import logging

import pytest

from csrun.emulator.remote import log_limit
from csrun.emulator.remote.log_limit import LimitedWarnings


def test_a_burst_then_one_per_interval_with_the_count(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    clock = [100.0]
    monkeypatch.setattr(log_limit.time, "monotonic", lambda: clock[0])
    caplog.set_level(logging.WARNING, logger="limit-test")
    limited = LimitedWarnings(logging.getLogger("limit-test"), burst=3, every_s=10.0)
    written = [limited.warning("auth", "guess %d", i) for i in range(8)]
    assert written == [True, True, True, False, False, False, False, False]
    assert limited.warning("other", "another kind") is True  # kinds are limited apart
    clock[0] += 10.5
    assert limited.warning("auth", "guess %d", 8) is True
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["guess 0", "guess 1", "guess 2", "another kind", "guess 8 (5 more like this in the last 10 s)"]
