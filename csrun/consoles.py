"""The rich console csrun prints its tables on: as wide as the terminal, or as wide as a log needs.

Off a terminal (a batch job's log, submitit's files, a pipe) rich falls back to 80 columns and
folds csrun's tables: the placement table took 46 lines for 10 rows, its headers and values
cut (``weigh…``). :func:`console` gives a terminal its own width and anything else
:data:`LOG_WIDTH` columns (or ``COLUMNS``, when set), so a table keeps one line per row.
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console

LOG_WIDTH = 160
"""Columns of a table written to a log (not a terminal)."""


def console(**kwargs: Any) -> Console:
    """A :class:`rich.console.Console` (``kwargs`` as rich's: ``stderr``, ``file``, ...) whose width,
    off a terminal, is ``COLUMNS`` or :data:`LOG_WIDTH` instead of rich's 80."""
    made = Console(**kwargs)
    if not made.is_terminal and "width" not in kwargs:
        columns = os.environ.get("COLUMNS", "")
        made.width = int(columns) if columns.isdigit() and int(columns) >= 40 else LOG_WIDTH
    return made


__all__ = ["LOG_WIDTH", "console"]
