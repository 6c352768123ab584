"""``cerebras.workflow.python.cs_perf_analyzer``: the system's input-bottleneck analysis.

The system wrote a ``csperf`` log the analyzer read; csrun writes none. Its own verdict on
whether a run was input-bound is in the run's ``performance.json`` and the Session's report
(:mod:`csrun.stream.stats`). :func:`locate_csperf_log` therefore finds no log (the zoo then
records "Not Applicable"), and :class:`AssessBottlenecks` cannot be built.
"""

from __future__ import annotations

from typing import Any

from csrun.torch.r1.unsupported import unsupported_class


def locate_csperf_log(model_dir: Any) -> None:
    """None: csrun writes no csperf log (its input-bound verdict is in performance.json)."""
    return None


AssessBottlenecks = unsupported_class(
    "cerebras.workflow.python.cs_perf_analyzer.AssessBottlenecks",
    "csrun writes no csperf log to assess; its input-bound verdict is in performance.json")
