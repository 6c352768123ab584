"""Progress on the chief: a rich bar on a real terminal, plain log lines otherwise.

On a real terminal a bar shows step/max, loss, samples/s and the ETA (redrawn 4 times a
second); the log lines of every ``log_steps`` step are printed above it. Otherwise (batch jobs,
job logs, pipes) only the log lines appear, flushed, one per ``log_steps`` step::

    | Train: step 200/1000, loss 0.5123, lr 0.001, 15234.1 samples/s

A real terminal (:func:`wants_bar`) is stdout being a tty, ``TERM`` not ``dumb``, and, inside a
Slurm step (``SLURM_STEP_ID``), an interactive one (``srun --pty``, which sets
``SLURM_PTY_PORT``): under ``srun --unbuffered`` the tasks may see a tty whose output goes to a
job log, where a redrawing bar would write its frames ten times a second.

Environment: ``CSRUN_PROGRESS`` = ``auto`` (default, the rule above), ``bar`` (always draw the
bar) or ``lines`` (never).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping, TextIO

from csrun.env_settings import env_name, env_settings

PROGRESS_ENV = env_name("progress")


def wants_bar(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``stream`` is a real terminal worth a redrawing bar (rule in the module manual)."""
    env = os.environ if environ is None else environ
    choice = env_settings(environ).progress
    if choice != "auto":
        return choice == "bar"
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a closed or stand-in stream
        tty = False
    if not tty or env.get("TERM", "") == "dumb":
        return False
    in_step = bool(env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "")).strip())
    return not in_step or bool(env.get("SLURM_PTY_PORT", "").strip())


def log_line(step: int, total: int, loss: float, lr: float | None, samples_per_sec: float) -> str:
    """One training log line."""
    lr_part = f", lr {lr:.6g}" if lr is not None else ""
    return f"| Train: step {step}/{total}, loss {loss:.6g}{lr_part}, {samples_per_sec:.1f} samples/s"


class Progress:
    """The chief's progress display for one training run."""

    def __init__(self, *, start: int, total: int, stream: TextIO | None = None, bar: bool | None = None) -> None:
        self.stream = stream or sys.stdout
        self.total = total
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
