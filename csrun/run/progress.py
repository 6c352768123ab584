"""Progress on the chief: a rich bar on a real terminal, plain log lines otherwise.

On a real terminal a bar shows step/max, loss, samples/s and the ETA (redrawn 4 times a
second); the log lines of every ``log_steps`` step are printed above it. Otherwise (batch jobs,
job logs, pipes) only the log lines appear, flushed, one per ``log_steps`` step, each after the
time of day (:func:`csrun.consoles.time_prefix`), with the time since the first step and the
time left at that pace::

    2026-11-27 00:52:10 | Train: step 200/1000, loss 0.5123, lr 0.001, 15234.1 samples/s, 0:00:03 elapsed, ETA 0:00:12

A real terminal (:func:`wants_bar`) is stdout being a tty, ``TERM`` not ``dumb``, and, inside a
Slurm step (``SLURM_STEP_ID``), an interactive one (``srun --pty``, which sets
``SLURM_PTY_PORT``): under ``srun --unbuffered`` the tasks may see a tty whose output goes to a
job log, where a redrawing bar would write its frames ten times a second.

Under ``csrun_wse`` the chief's stdout is a pipe, so it prints the lines; it also rewrites the
job's ``progress`` file (:func:`csrun.task_exits.report_progress`), from which the launcher,
when its own terminal is one, draws the bar there (:mod:`csrun.launch.live_bar`).

Environment: ``CSRUN_PROGRESS`` = ``auto`` (default, the rule above), ``bar`` (always draw the
bar) or ``lines`` (never; the launcher draws none either).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from csrun.consoles import clock, time_prefix
from csrun.launch.live_bar import wants_bar
from csrun.env_settings import env_name
from csrun.task_exits import ProgressNote, report_progress

PROGRESS_ENV = env_name("progress")
NOTE_EVERY_S = 0.25
"""How often, at most, the chief rewrites the launcher's progress file."""


def log_line(step: int, total: int, loss: float, lr: float | None, samples_per_sec: float, *,
             elapsed: float | None = None, eta: float | None = None) -> str:
    """One training log line (``elapsed``: seconds since the first step; ``eta``: seconds left)."""
    lr_part = f", lr {lr:.6g}" if lr is not None else ""
    time_part = f", {clock(elapsed)} elapsed" if elapsed is not None else ""
    time_part += f", ETA {clock(eta)}" if eta is not None else ""
    return f"| Train: step {step}/{total}, loss {loss:.6g}{lr_part}, {samples_per_sec:.1f} samples/s{time_part}"


class Progress:
    """The chief's progress display for one training run."""

    def __init__(self, *, start: int, total: int, stream: TextIO | None = None, bar: bool | None = None) -> None:
        self.stream = stream or sys.stdout
        self.total = total
        self.start = start
        self._first: tuple[float, int] | None = None  # (when, step) of the first step read: the clock's start
        self._noted = 0.0  # when the launcher's progress file was last written
        use_bar = wants_bar(self.stream) if bar is None else bar
        self._progress: Any = None
        self._task: Any = None
        if use_bar:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn

            self._progress = RichProgress(
                TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]} samples/s"),
                TimeRemainingColumn(), console=Console(file=self.stream), transient=False,
                refresh_per_second=4)
            self._task = self._progress.add_task("train", total=total, completed=start, loss="-", rate="-")
            self._progress.start()

    def step(self, step: int, loss: float, samples_per_sec: float | None) -> None:
        """Advance the bar to ``step``; in a csrun_wse job, tell the launcher too (a few times a
        second at most: :func:`csrun.task_exits.report_progress`)."""
        now = time.monotonic()
        if now - self._noted >= NOTE_EVERY_S or step >= self.total:
            self._noted = now
            report_progress(ProgressNote(step, self.total, loss, samples_per_sec or 0.0, self.timing(step)[1] or 0.0))
        if self._progress is not None:
            fields: dict[str, Any] = {"loss": f"{loss:.4g}"}
            if samples_per_sec is not None:
                fields["rate"] = f"{samples_per_sec:.0f}"
            self._progress.update(self._task, completed=step, **fields)

    def timing(self, step: int) -> tuple[float, float | None]:
        """(seconds since the first step read, seconds left at that pace: None until a step is done
        after it). The clock starts at the first step read, after the first step's compile."""
        now = time.monotonic()
        if self._first is None:
            self._first = (now, step)
        first_at, first_step = self._first
        elapsed = now - first_at
        return elapsed, (elapsed / (step - first_step) * (self.total - step) if step > first_step else None)

    def log(self, line: str) -> None:
        """Print a log line (above the bar when there is one; off a terminal after the time of day)."""
        if self._progress is not None:
            self._progress.console.print(line, markup=False, highlight=False)
        else:
            print(f"{time_prefix(self.stream)}{line}", file=self.stream, flush=True)

    def close(self) -> None:
        """Stop the bar."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
