"""One log file per task: ``<dir>/<job>-<rank>.log``, the console keeping the chief's output.

``csrun_wse --log-dir DIR`` and ``csrun_cpu --log-dir DIR`` set ``CSRUN_TASK_LOG_DIR`` (and, off
Slurm, ``CSRUN_JOB_LABEL``) for every task; the task wrapper (:mod:`csrun.launch.task`) then
runs its command with stdout and stderr on pipes and copies every line into the task's file
(both streams, in the order they arrive; a header line marks each attempt, so a requeued job
appends), each line prefixed with ``[rank N] `` (torchrun's ``--tee`` style, so a ``grep``
over the folder says whose line it is), and, on the chief (rank 0) only, onto its own
stdout/stderr as well, unprefixed. Streamers' output
goes only to their files, so the console is the chief's and ``srun --unbuffered`` no longer
interleaves tasks mid-line; when a task fails, the supervisor's line names its file. Without
``--log-dir`` a streamer's lines reach the console prefixed ``[rank N] `` (a traceback says
whose it is; :func:`copy_lines`), the chief's as they are.

The file name: ``<job>`` is ``SLURM_HET_JOB_ID``, else ``SLURM_JOB_ID``, else
``CSRUN_JOB_LABEL`` (``local-<launcher pid>`` for an mpiexec job), else ``local``;
``<rank>`` the task's rank (:mod:`csrun.cluster`). Lines are copied whole (one write each),
so a line never mixes with another; the child gets ``PYTHONUNBUFFERED=1`` (unless set) so
its prints arrive when they are made. A copy that cannot be written (disk full) is dropped
without stopping the task.

Environment read: ``CSRUN_TASK_LOG_DIR``, ``CSRUN_JOB_LABEL``, ``SLURM_HET_JOB_ID``,
``SLURM_JOB_ID``.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Mapping

from csrun.env_settings import JOB_LABEL, TASK_LOG_DIR
from csrun.errors import UsageError

LOG_DIR_ENV = TASK_LOG_DIR.name
"""The folder for the per-task files; unset: no files, the task's output goes straight through."""
JOB_LABEL_ENV = JOB_LABEL.name
"""The ``<job>`` part of the file name when the job is not a Slurm job."""


def job_label(environ: Mapping[str, str]) -> str:
    """The ``<job>`` part of a task's log file name (module manual)."""
    for name in ("SLURM_HET_JOB_ID", "SLURM_JOB_ID", JOB_LABEL_ENV):
        value = environ.get(name, "").strip()
        if value:
            return value
    return "local"


def task_log_path(folder: str | Path, environ: Mapping[str, str], rank: int) -> Path:
    """``<folder>/<job>-<rank>.log``."""
    return Path(folder) / f"{job_label(environ)}-{rank}.log"


Sink = tuple[IO[bytes], bytes, "threading.Lock | None"]
"""Where a copied line goes: the stream, the prefix written before it, the lock held around the write."""


@dataclass
class TaskLog:
    """Where one task's output goes: its file, and the console too when ``echo`` (the chief)."""

    path: Path
    echo: bool
    rank: int = 0

    def open(self, header: str) -> IO[bytes]:
        """The file, opened for appending, with ``header`` written as the attempt's first line."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.path, "ab", buffering=0)
        out.write(f"=== {header} ({time.strftime('%Y-%m-%d %H:%M:%S')}) ===\n".encode())
        return out

    def pump(self, source: IO[bytes], file: IO[bytes], console: IO[bytes] | None, lock: threading.Lock) -> threading.Thread:
        """A started thread that copies ``source`` line by line into ``file`` (prefixed with the
        rank) and ``console`` (as it is) until it ends."""
        sinks: list[Sink] = [(file, f"[rank {self.rank}] ".encode(), lock)]
        if console is not None:
            sinks.append((console, b"", None))
        return copy_lines(source, sinks, f"csrun-task-log-{self.path.name}")


def copy_lines(source: IO[bytes], sinks: list[Sink], name: str) -> threading.Thread:
    """A started daemon thread copying ``source`` line by line into every sink (each line one
    write, flushed) until it ends."""

    def copy() -> None:
        for line in iter(source.readline, b""):
            for out, prefix, lock in sinks:
                if lock is not None:
                    with lock:
                        _write(out, prefix + line)
                else:
                    _write(out, prefix + line)
                try:
                    out.flush()
                except (OSError, ValueError):
                    pass
        source.close()

    thread = threading.Thread(target=copy, name=name, daemon=True)
    thread.start()
    return thread


def _write(out: IO[bytes], data: bytes) -> None:
    try:
        out.write(data)
    except (OSError, ValueError):
        pass


def task_log_for(environ: Mapping[str, str], rank: int) -> TaskLog | None:
    """This task's :class:`TaskLog` when ``CSRUN_TASK_LOG_DIR`` is set, else None."""
    folder = environ.get(LOG_DIR_ENV, "").strip()
    if not folder:
        return None
    return TaskLog(task_log_path(folder, environ, rank), echo=rank == 0, rank=rank)


def unbuffered(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with ``PYTHONUNBUFFERED=1`` unless it sets it (output is piped through the wrapper)."""
    env = dict(environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def task_log_environment(log_dir: str, *, slurm: bool) -> dict[str, str]:
    """The variables that turn per-task log files on for a job's tasks: ``CSRUN_TASK_LOG_DIR``
    (``log_dir`` made absolute and created now) and, off Slurm, ``CSRUN_JOB_LABEL``
    (``local-<this pid>``). A folder that cannot be made is a :class:`~csrun.errors.UsageError`
    naming it, before any task starts."""
    folder = Path(log_dir).expanduser().resolve()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--log-dir {log_dir}: cannot make that folder ({exc.strerror or exc}); "
                         f"give a folder you can write (e.g. --log-dir csrun_logs)") from None
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--log-dir {log_dir}: that folder is not writable; give one you can write")
    env = {LOG_DIR_ENV: str(folder)}
    if not slurm:
        env[JOB_LABEL_ENV] = f"local-{os.getpid()}"
    return env


def find_task_log(log_dir: str, rank: int) -> Path | None:
    """The newest ``<job>-<rank>.log`` in ``log_dir`` (the failed task's file for the
    supervisor's line), or None."""
    try:
        found = sorted(Path(log_dir).glob(f"*-{rank}.log"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return None
    return found[-1] if found else None
