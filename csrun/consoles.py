"""How csrun's console output suits a log: tables as wide as they need, lines with their time.

Off a terminal (a batch job's log, submitit's files, a pipe) rich falls back to 80 columns and
folds csrun's tables: the placement table took 46 lines for 10 rows, its headers and values
cut (``weigh…``). :func:`console` gives a terminal its own width and anything else
:data:`LOG_WIDTH` columns (or ``COLUMNS``, when set), so a table keeps one line per row. :func:`time_prefix` gives a line printed off a terminal the
time of day in front (a log file's lines say when; a terminal's need not).
:func:`whole_lines` makes each printed line one write, so lines of processes sharing a stream do not mix.
"""

from __future__ import annotations

import io
import os
import sys
import time
from typing import IO, TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # rich is imported when a console is made: a task wrapper needs only whole_lines
    from rich.console import Console

LOG_WIDTH = 160
"""Columns of a table written to a log (not a terminal)."""


def console(**kwargs: Any) -> Console:
    """A :class:`rich.console.Console` (``kwargs`` as rich's: ``stderr``, ``file``, ...) whose width,
    off a terminal, is ``COLUMNS`` or :data:`LOG_WIDTH` instead of rich's 80; a tty that is a job
    log (:func:`on_terminal`) gets no colours or cursor codes."""
    from rich.console import Console

    made = Console(**kwargs)
    if made.is_terminal and "force_terminal" not in kwargs and not on_terminal(made.file):
        made = Console(**kwargs, force_terminal=False)
    if not made.is_terminal and "width" not in kwargs:
        columns = os.environ.get("COLUMNS", "")
        made.width = int(columns) if columns.isdigit() and int(columns) >= 40 else LOG_WIDTH
    return made


def on_terminal(stream: IO[str], environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``stream`` is a terminal a person watches: a tty, and inside a Slurm step
    (``SLURM_STEP_ID``) an interactive one (``srun --pty``, which sets ``SLURM_PTY_PORT``): under
    ``srun --unbuffered`` a task may see a tty whose output goes to a job log. A closed or
    stand-in stream is not one."""
    env = os.environ if environ is None else environ
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    in_step = bool(env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "")).strip())
    return tty and (not in_step or bool(env.get("SLURM_PTY_PORT", "").strip()))


def time_prefix(stream: IO[str]) -> str:
    """``"2026-11-27 00:52:10 "`` off a terminal, ``""`` on one."""
    return "" if on_terminal(stream) else time.strftime("%Y-%m-%d %H:%M:%S ")


def clock(seconds: float) -> str:
    """``H:MM:SS`` of a duration (rounded to the second)."""
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def whole_lines() -> None:
    """Make each line this process prints on stdout and stderr one write, also under
    ``PYTHONUNBUFFERED=1`` (``python -u``, which task wrappers and many images set).

    Unbuffered, ``print`` writes its text and its newline apart, and where several processes
    share a pipe or terminal (a job's tasks and its launcher) another's line lands between them:
    ``...running /usr/bin/pythoncsrun_wse: task rank 2 ... ending the job``. Line buffering is
    Python's own default for stderr: output still leaves at each newline (and at each flush). A
    stream that is not the process's raw file (a test's capture, a user's own) stays as it is."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.write_through and isinstance(stream.buffer, io.FileIO):
            stream.reconfigure(line_buffering=True, write_through=False)


__all__ = ["LOG_WIDTH", "clock", "console", "on_terminal", "time_prefix", "whole_lines"]
