"""csrun_wse's progress bar on the launcher's own terminal.

Under csrun_wse the chief's stdout is a pipe of mpiexec or srun, so the chief prints calm lines
(which job logs keep) and never draws a bar. When csrun_wse itself runs on a terminal a person
watches (:func:`csrun.consoles.on_terminal`, ``TERM`` not ``dumb``, ``CSRUN_PROGRESS`` not
``lines``), it draws the bar there instead: the step's output comes to the launcher through
pipes and is printed above the bar, line by line, and the bar shows the chief's step/total,
loss, samples/s and ETA, read from the job's ``progress`` file a few times a second
(:func:`csrun.task_exits.read_progress`). The bar appears at the first report (a script that is
not the runner has none) and is removed when the step ends. ``CSRUN_PROGRESS=bar`` draws it
wherever the launcher's stdout goes.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import IO, Any

from csrun.consoles import on_terminal
from csrun.env_settings import env_settings
from csrun.task_exits import read_progress


def wanted(environ: dict[str, str] | None = None) -> bool:
    """Whether the launcher draws the bar (module manual)."""
    env = dict(os.environ) if environ is None else environ
    choice = env_settings(env).progress
    if choice != "auto":
        return choice == "bar"
    return on_terminal(sys.stdout, env) and env.get("TERM", "") != "dumb"


def _clock(seconds: float) -> str:
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class LiveBar:
    """The bar below the step's output (use :meth:`start`, :meth:`pump` each pipe, :meth:`refresh`, :meth:`stop`)."""

    def __init__(self, state_dir: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.state_dir = state_dir
        self._progress: Any = Progress(
            TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[rate]} samples/s"), TextColumn("ETA {task.fields[eta]}"),
            console=Console(file=sys.stdout, force_terminal=True), transient=True, refresh_per_second=4)
        self._task: Any = None
        self._lock = threading.Lock()
        self._progress.start()

    def pump(self, source: IO[bytes]) -> threading.Thread:
        """A started thread printing ``source``'s lines above the bar until it ends."""

        def copy() -> None:
            for raw in iter(source.readline, b""):
                line = raw.decode(errors="replace").rstrip("\n")
                with self._lock:
                    self._progress.console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)
            source.close()

        thread = threading.Thread(target=copy, name="csrun-live-bar", daemon=True)
        thread.start()
        return thread

    def refresh(self) -> None:
        """Move the bar to the chief's last report."""
        note = read_progress(self.state_dir)
        if note is None:
            return
        fields = {"loss": f"{note.loss:.4g}", "rate": f"{note.rate:.0f}", "eta": _clock(note.eta)}
        with self._lock:
            if self._task is None:
                self._task = self._progress.add_task("train", total=note.total, completed=note.step, **fields)
            else:
                self._progress.update(self._task, total=note.total, completed=note.step, **fields)

    def stop(self) -> None:
        """Remove the bar (the step's output stays)."""
        with self._lock:
            self._progress.stop()
