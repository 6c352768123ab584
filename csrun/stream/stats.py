"""Throughput figures of one input stream, and the end-of-run diagnosis.

Each streamer counts its batches, bytes, time spent in the input pipeline and time blocked
waiting for credit (the chief was behind); it sends those to the chief when told to stop.
The chief counts the time it waited for input and the time it spent in steps. When the
chief waited for input for more than :data:`INPUT_BOUND_FRACTION` of the time, the run is
**input-bound** (the legacy ``suspected_input_bottleneck``): more streamers or more loader
workers would make it faster.

:class:`StreamStats` is what the runner writes to ``performance.json``
(:meth:`StreamStats.to_dict`); :func:`print_report` prints the table.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from csrun.stream.source import EPOCH_END, BatchStream

INPUT_BOUND_FRACTION = 0.10
"""The chief's input-wait share of the run above which the run is called input-bound."""


@dataclass(kw_only=True)
class StreamerStats:
    """What one streamer did."""

    rank: int
    """Global MPI rank of the streamer."""
    node: str
    """Node the streamer ran on."""
    batches: int = 0
    """Batches sent."""
    bytes: int = 0
    """Bytes sent (wire dtypes)."""
    seconds: float = 0.0
    """Wall time from its first batch request to the stop."""
    pipeline_s: float = 0.0
    """Time inside the input pipeline (the user's loader)."""
    credit_wait_s: float = 0.0
    """Time blocked with a batch ready but no credit (the chief was behind)."""
    credit_wait_cpu_s: float = 0.0
    """CPU time the process used during those waits (what waiting costs, a small share of the wait: BENCHMARKS.md)."""

    @property
    def batches_per_s(self) -> float:
        """Batches per second over :attr:`seconds`."""
        return self.batches / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        """Megabytes (1e6) per second over :attr:`seconds`."""
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "StreamerStats":
        """Inverse of :func:`dataclasses.asdict`, ignoring unknown keys."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in doc.items() if k in names})


@dataclass(kw_only=True)
class ChiefStats:
    """Where the chief's time went between its first and last batch."""

    batches: int = 0
    """Batches handed to the training loop."""
    input_wait_s: float = 0.0
    """Time inside the dataloader's ``next()`` waiting for a batch."""
    step_s: float = 0.0
    """Time between handing out a batch and asking for the next (the step, closures included)."""

    @property
    def input_fraction(self) -> float:
        """Share of the chief's time spent waiting for input."""
        total = self.input_wait_s + self.step_s
        return self.input_wait_s / total if total > 0 else 0.0


class TimedInput:
    """A chief's stream with its clock: time in :meth:`next` is input wait, the time from handing
    out a batch to asking for the next is step time (:class:`ChiefStats`)."""

    def __init__(self, stream: BatchStream, stats: ChiefStats) -> None:
        self.stream = stream
        self.stats = stats
        self._handed_at: float | None = None

    def next(self) -> Any:
        """The stream's next batch (or ``EPOCH_END``), timed."""
        t0 = time.perf_counter()
        if self._handed_at is not None:
            self.stats.step_s += t0 - self._handed_at
        item = self.stream.next()
        t1 = time.perf_counter()
        self.stats.input_wait_s += t1 - t0
        if item is EPOCH_END:
            self._handed_at = None
            return item
        self.stats.batches += 1
        self._handed_at = t1
        return item


@dataclass(kw_only=True)
class StreamStats:
    """Figures of one session's input stream: the chief and every streamer."""

    chief: ChiefStats = field(default_factory=ChiefStats)
    """The chief's side."""
    streamers: list[StreamerStats] = field(default_factory=list)
    """One entry per streamer, by rank (empty for a lone chief)."""
    threshold: float = INPUT_BOUND_FRACTION
    """Input-wait share above which the run is input-bound."""

    @property
    def input_bound(self) -> bool:
        """True when the chief waited for input more than :attr:`threshold` of the time."""
        return self.chief.input_fraction > self.threshold

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form, derived rates and the verdict included."""
        return {
            "chief": {**asdict(self.chief), "input_fraction": self.chief.input_fraction},
            "streamers": [{**asdict(s), "batches_per_s": s.batches_per_s, "mb_per_s": s.mb_per_s}
                          for s in self.streamers],
            "input_bound": self.input_bound,
            "threshold": self.threshold,
        }

    def advice(self) -> str:
        """One line: the verdict and what to do about it."""
        pct = 100 * self.chief.input_fraction
        if self.input_bound:
            return (f"input-bound: the chief waited for input {pct:.0f}% of the time (over "
                    f"{100 * self.threshold:.0f}%); add workers (more streamer tasks, or "
                    "num_workers in the input config)")
        return f"not input-bound: the chief waited for input {pct:.0f}% of the time"


def report_table(stats: StreamStats) -> Any:
    """A :class:`rich.table.Table` with one row per streamer and one for the chief."""
    from rich.table import Table

    table = Table(title="input stream", title_justify="left")
    columns = ("task", "node", "batches", "batch/s", "MB/s", "pipeline s", "credit wait s",
               "input wait s", "step s")
    for col in columns:
        table.add_column(col, justify="left" if col in ("task", "node") else "right")
    for s in stats.streamers:
        table.add_row(f"streamer {s.rank}", s.node, str(s.batches), f"{s.batches_per_s:.1f}",
                      f"{s.mb_per_s:.1f}", f"{s.pipeline_s:.2f}", f"{s.credit_wait_s:.2f}", "", "")
    c = stats.chief
    table.add_row("chief", "", str(c.batches), "", "", "", "", f"{c.input_wait_s:.2f}", f"{c.step_s:.2f}")
    return table


def print_report(stats: StreamStats, console: Any = None) -> None:
    """Print the table and the input-bound verdict (on stdout, with the run's other lines, unless a
    rich console is given)."""
    from csrun.consoles import console as log_console

    if console is None:
        console = log_console()  # off a terminal: not folded at 80 columns
    console.print(report_table(stats))
    console.print(stats.advice())
