"""csrun_wse's progress bar on the launcher's own terminal.

Under csrun_wse the chief's stdout is a pipe of mpiexec or srun, so the chief prints calm lines
(which job logs keep) and never draws a bar. When csrun_wse itself runs on a terminal a person
watches (:func:`csrun.consoles.on_terminal`, ``TERM`` not ``dumb``, ``CSRUN_PROGRESS`` not
``lines``), it draws the bar there instead: the step's output comes to the launcher through
pipes and is printed above the bar, line by line (its stderr only when stderr is that same
terminal: ``2>file`` keeps its own lines), and the bar shows the chief's step/total,
loss, samples/s and ETA, read from the job's ``progress`` file a few times a second
(:func:`csrun.task_exits.read_progress`). The bar appears at the first report (a script that is
not the runner has none) and is removed when the step ends. ``CSRUN_PROGRESS=bar`` draws it
wherever the launcher's stdout goes.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import IO, Any, Mapping

from csrun.consoles import clock, on_terminal
from csrun.env_settings import env_settings
from csrun.task_exits import read_progress


def same_terminal() -> bool:
    """Whether stderr is the terminal stdout is (then the step's stderr is shown above the bar too;
    a redirected stderr keeps its own lines)."""
    try:
        return os.path.samestat(os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno()))
    except (OSError, ValueError, AttributeError):
        return False


def wants_bar(stream: IO[str], environ: Mapping[str, str] | None = None) -> bool:
    """Whether a redrawing bar suits ``stream``: ``CSRUN_PROGRESS`` (``bar`` / ``lines``), else a
    terminal a person watches (:func:`csrun.consoles.on_terminal`) whose ``TERM`` is not ``dumb``.
    The one rule, for the runner's own bar (:mod:`csrun.run.progress`) and the launcher's."""
    env = os.environ if environ is None else environ
    choice = env_settings(env).progress
    if choice != "auto":
        return choice == "bar"
    return on_terminal(stream, env) and env.get("TERM", "") != "dumb"


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the launcher draws the bar on its stdout (module manual)."""
    return wants_bar(sys.stdout, environ)


class LiveBar:
    """The bar below the step's output (use :meth:`start`, :meth:`pump` each pipe, :meth:`refresh`, :meth:`stop`)."""

    def __init__(self, state_dir: str, *, with_stderr: bool) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.state_dir = state_dir
        self._progress: Any = Progress(
            TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[rate]} samples/s"), TextColumn("ETA {task.fields[eta]}"),
            console=Console(file=sys.stdout, force_terminal=True), transient=True, refresh_per_second=4,
            redirect_stdout=True, redirect_stderr=with_stderr)
        self._task: Any = None
        self._lock = threading.Lock()
        self._progress.start()

    def pump(self, source: IO[bytes]) -> threading.Thread:
        """A started thread printing ``source``'s lines above the bar until it ends."""

        def copy() -> None:
            for raw in iter(source.readline, b""):
                line = raw.decode(errors="replace").rstrip("\n")
                try:
                    with self._lock:
                        self._progress.console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)
                except (OSError, ValueError):  # the terminal went away: keep draining, or the tasks would block
                    continue
            source.close()

        thread = threading.Thread(target=copy, name="csrun-live-bar", daemon=True)
        thread.start()
        return thread

    def refresh(self) -> None:
        """Move the bar to the chief's last report."""
        note = read_progress(self.state_dir)
        if note is None:
            return
        fields = {"loss": f"{note.loss:.4g}", "rate": f"{note.rate:.0f}", "eta": clock(note.eta)}
        with self._lock:
            if self._task is None:
                self._task = self._progress.add_task("train", total=note.total, completed=note.step, **fields)
            else:
                self._progress.update(self._task, total=note.total, completed=note.step, **fields)

    def stop(self) -> None:
        """Remove the bar (the step's output stays)."""
        with self._lock:
            self._progress.stop()
