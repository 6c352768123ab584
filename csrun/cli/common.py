"""What every command shares: turning user errors into one message and an exit code, running a child."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
from typing import Callable, Sequence

from csrun.errors import LaunchError, UserError


def run_cli(prog: str, body: Callable[[list[str]], int], argv: Sequence[str] | None) -> int:
    """Run a command's body on ``argv`` (default ``sys.argv[1:]``); a :class:`UserError` becomes
    ``prog: error: ...`` on stderr and its exit code."""
    try:
        return body(sys.argv[1:] if argv is None else list(argv))
    except UserError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return 130


def console_entry(main: Callable[[], int]) -> Callable[[], None]:
    """The console-script function for a command's ``main``: exits with its code."""

    def console_main() -> None:
        sys.exit(main())

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


def run_child(argv: Sequence[str], env: dict[str, str], *, keep_fds: bool = False) -> int:
    """Run ``argv`` to the end, passing SIGINT/SIGTERM/SIGHUP/SIGUSR1/SIGUSR2 on to it; its exit code (128+N for signal N).

    ``keep_fds``: the child inherits every open file descriptor (an MPI task needs the PMI
    socket srun gave this process, named by ``PMI_FD``).
    """
    child = subprocess.Popen(list(argv), env=env, close_fds=not keep_fds)
    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
    previous = {s: signal.getsignal(s) for s in forwarded}

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    try:
        for s in forwarded:
            signal.signal(s, forward)
    except ValueError:  # not the main thread: signals stay as they are
        previous = {}
    try:
        code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code
