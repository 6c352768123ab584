"""What every command shares: its console entry, echoing and running its launch line.

``run_cli`` (user errors as one line and an exit code) and ``run_child`` (a child with
signals passed on) live in :mod:`csrun.launch.process`, where launch wrappers can reach
them; they are re-exported here for the commands.
"""

from __future__ import annotations

import shlex
import sys
from typing import Callable, Sequence

from csrun.errors import LaunchError
from csrun.launch.process import ignore_late_ctrl_c, run_child, run_cli

__all__ = ["run_cli", "run_child", "console_entry", "show_and_run", "say", "shown"]


def console_entry(main: Callable[[], int]) -> Callable[[], None]:
    """The console-script function for a command's ``main``: exits with its code, which a Ctrl-C
    arriving after ``main`` returned does not change (:func:`~csrun.launch.process.ignore_late_ctrl_c`)."""

    def console_main() -> None:
        code = 130  # a Ctrl-C outside the body's own handling: the shell's 128 + SIGINT
        try:
            code = main()
        except KeyboardInterrupt:
            pass
        finally:
            ignore_late_ctrl_c()
        sys.exit(code)

    console_main.__doc__ = f"The console script of {main.__module__}."
    return console_main


def show_and_run(label: str, line: list[str], env: dict[str, str], *, echo: bool, dry_run: bool) -> int:
    """Print ``<label>: <line>`` (when ``echo`` or ``dry_run``), then run it unless ``dry_run``."""
    if echo or dry_run:
        say(f"{label}: {shown(line)}")
    if dry_run:
        return 0
    try:
        return run_child(line, env)
    except FileNotFoundError:
        raise LaunchError(f"command not found: {line[0]!r}") from None


def say(line: str) -> None:
    """Print one line for the user, flushed before any child writes."""
    print(line, flush=True)


def shown(argv: Sequence[str]) -> str:
    """An argv as a shell line a user could paste."""
    return shlex.join(list(argv))
