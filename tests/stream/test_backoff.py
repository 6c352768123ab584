"""The stream's waits: poll, then sleep longer each idle round up to a cap; a deadline ends them."""

from __future__ import annotations

import pytest

from csrun.stream import wire
from csrun.stream.wire import Backoff, wait_for


def test_sleeps_grow_by_half_and_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(wire.time, "sleep", slept.append)
    b = Backoff(busy_s=0.0, min_sleep=1e-4, max_sleep=1e-3)
    for _ in range(12):
        b.idle()
    assert slept[0] == pytest.approx(1e-4)
    assert all(b2 >= b1 for b1, b2 in zip(slept, slept[1:]))
    assert slept[1] == pytest.approx(1.5e-4) and max(slept) == pytest.approx(1e-3) and slept[-1] == pytest.approx(1e-3)
    b.reset()
    assert b.sleep_s == 0.0


def test_the_busy_phase_does_not_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(wire.time, "sleep", slept.append)
    b = Backoff(busy_s=3600.0)
    for _ in range(5):
        b.idle()
    assert slept == []


def test_the_streamer_pace_sleeps_at_once_and_the_chief_pace_is_short() -> None:
    assert Backoff.streamer()._busy_s == 0.0 and Backoff.streamer()._max >= Backoff.transfer()._max
    assert Backoff.transfer()._max <= 0.001


def test_a_streamer_with_sends_in_flight_sleeps_from_the_first_idle_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiting for credit with sends in flight: the chief reads them only when it takes its next
    batch, so the streamer polls them asleep between (no flat-out phase), and never sleeps
    longer than the transfer pace's cap (a chief waiting for one of them sees it move soon)."""
    slept: list[float] = []
    monkeypatch.setattr(wire.time, "sleep", slept.append)
    b = Backoff.sending()
    for _ in range(30):
        b.idle()
    assert len(slept) == 30 and slept[0] <= 1e-4
    assert max(slept) == pytest.approx(Backoff.transfer()._max)


def test_wait_for_returns_when_ready_and_raises_past_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire.time, "sleep", lambda s: None)
    calls = iter([False, False, True])
    wait_for(lambda: next(calls), Backoff.streamer())
    with pytest.raises(TimeoutError, match="credit"):
        wait_for(lambda: False, Backoff.streamer(), deadline=wire.time.monotonic() - 1, what="credit")
