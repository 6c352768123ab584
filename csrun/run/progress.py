"""Progress on the chief: a rich bar on a terminal, plain log lines otherwise.

On a terminal (stdout is a tty) a bar shows step/max, loss, samples/s and the ETA; the
log lines of every ``log_steps`` step are printed above it. Otherwise (batch jobs, pipes)
only the log lines appear, flushed, one per ``log_steps`` step::

    | Train: step 200/1000, loss 0.5123, lr 0.001, 15234.1 samples/s
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


def log_line(step: int, total: int, loss: float, lr: float | None, samples_per_sec: float) -> str:
    """One training log line."""
    lr_part = f", lr {lr:.6g}" if lr is not None else ""
    return f"| Train: step {step}/{total}, loss {loss:.6g}{lr_part}, {samples_per_sec:.1f} samples/s"


class Progress:
    """The chief's progress display for one training run."""

    def __init__(self, *, start: int, total: int, stream: TextIO | None = None, bar: bool | None = None) -> None:
        self.stream = stream or sys.stdout
        self.total = total
        use_bar = self.stream.isatty() if bar is None else bar
        self._progress: Any = None
        self._task: Any = None
        if use_bar:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn

            self._progress = RichProgress(
                TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]} samples/s"),
                TimeRemainingColumn(), console=Console(file=self.stream), transient=False)
            self._task = self._progress.add_task("train", total=total, completed=start, loss="-", rate="-")
            self._progress.start()

    def step(self, step: int, loss: float, samples_per_sec: float | None) -> None:
        """Advance the bar to ``step`` (no-op without a bar)."""
        if self._progress is not None:
            fields: dict[str, Any] = {"loss": f"{loss:.4g}"}
            if samples_per_sec is not None:
                fields["rate"] = f"{samples_per_sec:.0f}"
            self._progress.update(self._task, completed=step, **fields)

    def log(self, line: str) -> None:
        """Print a log line (above the bar when there is one)."""
        if self._progress is not None:
            self._progress.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        """Stop the bar."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
