"""Stream statistics and the input-bound verdict."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from csrun.stream.stats import ChiefStats, StreamerStats, StreamStats, print_report

pytestmark = pytest.mark.timeout(30)


def test_input_bound_above_threshold_with_advice():
    stats = StreamStats(chief=ChiefStats(batches=10, input_wait_s=2.0, step_s=8.0))
    assert stats.chief.input_fraction == pytest.approx(0.2)
    assert stats.input_bound
    assert "input-bound" in stats.advice() and "add workers" in stats.advice()
    calm = StreamStats(chief=ChiefStats(batches=10, input_wait_s=0.5, step_s=9.5))
    assert not calm.input_bound and calm.advice().startswith("not input-bound")


def test_to_dict_is_json_and_has_rates():
    s = StreamerStats(rank=1, node="n1", batches=10, bytes=5_000_000, seconds=2.0, credit_wait_s=0.5)
    stats = StreamStats(chief=ChiefStats(batches=10, input_wait_s=1.0, step_s=1.0), streamers=[s])
    doc = json.loads(json.dumps(stats.to_dict()))
    assert doc["streamers"][0]["batches_per_s"] == 5.0 and doc["streamers"][0]["mb_per_s"] == 2.5
    assert doc["input_bound"] is True and doc["chief"]["input_fraction"] == 0.5
    assert StreamerStats.from_dict({**doc["streamers"][0], "extra": 1}) == s


def test_report_prints_table_and_verdict():
    buf = io.StringIO()
    stats = StreamStats(chief=ChiefStats(batches=3, input_wait_s=3.0, step_s=1.0),
                        streamers=[StreamerStats(rank=2, node="cs-w1", batches=3, bytes=3000, seconds=1.0)])
    print_report(stats, Console(file=buf, width=120))
    text = buf.getvalue()
    assert "streamer 2" in text and "cs-w1" in text and "input-bound" in text
