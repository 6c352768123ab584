"""The launcher's side of a job: start the step, end the whole job when any task fails, clean up.

csrun_wse (local ``mpiexec`` and Slurm ``srun`` alike) runs its step through :func:`supervise`:

- every task runs under :mod:`csrun.launch.task`, which writes ``exit.<rank>`` (its command's
  own exit code and its node) into the job's state folder (``CSRUN_JOB_STATE``) however the
  command ends, before or after MPI init, in user code or in csrun's own exit hooks;
- the step's launcher (mpiexec or srun) runs in its own process group and dies with csrun_wse
  (``PR_SET_PDEATHSIG``: a ``kill -9`` of csrun_wse takes mpiexec, srun, the tasks and a job's
  emulator along);
- the supervisor polls the folder every 0.1 s. At the first non-zero code it prints one line,
  ``csrun_wse: task rank R on NODE exited with code C; ending the job``, gives the step
  :data:`GRACE_S` to end by itself (srun's ``--kill-on-bad-exit``, mpiexec's own abort), then
  SIGTERMs its process group and SIGKILLs it :data:`KILL_AFTER_S` later. The job's exit code is
  that task's own code (a crash's 1 or 3, not srun's 137/143; a preempted chief's 128+signal
  stays as it is); without a report it is the step's;
- whatever the ending, MPICH's shared-memory segments that this job left in ``/dev/shm``
  (``mpich_shm_*`` owned by this user, created after the step started and mapped by no
  process any more) are removed on this node.

The state folder is made in the working directory (``.csrun_job.<random>``, which Slurm
nodes usually share with the submitting one) under Slurm, in the temporary folder otherwise,
and removed at the end; its ``owner`` file names the launcher, so that after a ``kill -9`` of
the launcher the next launch removes it and the job's other leftovers (:mod:`csrun.launch.reaper`). Where the working directory is not shared, exit reports from other
nodes do not arrive: the job then ends by srun's own means, with srun's exit code. Other
nodes' ``/dev/shm`` is left to Slurm's epilog.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from csrun.launch.process import die_with_parent
from csrun.launch.task import STATE_ENV
from csrun.launch.task_log import LOG_DIR_ENV, find_task_log

GRACE_S = 2.0
"""Seconds the step gets to end by itself after a task failed, before it is terminated."""
KILL_AFTER_S = 3.0
"""Seconds between SIGTERM and SIGKILL of the step's process group."""
POLL_S = 0.1
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
SHM = Path("/dev/shm")
OWNER = "owner"
"""The file in a state folder naming its launcher, ``<pid> <host>`` (:mod:`csrun.launch.reaper` reads it)."""


@dataclass(frozen=True)
class TaskExit:
    """A task's report: its rank, node and exit code."""

    rank: int
    node: str
    code: int


def task_command(command: Sequence[str]) -> list[str]:
    """``command`` run under the task wrapper (:mod:`csrun.launch.task`)."""
    return [sys.executable, "-m", "csrun.launch.task", "--", *command]


def make_state_dir(shared: bool) -> str:
    """A fresh state folder: in the working directory when the tasks may run on other nodes."""
    folder = None
    if shared:
        try:
            folder = tempfile.mkdtemp(prefix=".csrun_job.", dir=os.getcwd())
        except OSError:
            pass
    folder = folder or tempfile.mkdtemp(prefix="csrun_job.")
    (Path(folder) / OWNER).write_text(f"{os.getpid()} {socket.gethostname()}\n")
    return folder


def read_exits(state_dir: str) -> list[TaskExit]:
    """The reports in ``state_dir``, oldest first."""
    found = []
    for path in Path(state_dir).glob("exit.*"):
        try:
            code_text, _, node = path.read_text().strip().partition(" ")
            found.append((path.stat().st_mtime_ns, TaskExit(int(path.name.split(".", 1)[1]), node, int(code_text))))
        except (OSError, ValueError):
            continue
    return [e for _, e in sorted(found, key=lambda pair: (pair[0], pair[1].rank))]


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def mapped_files() -> set[str]:
    """Every file some process on this node has mapped (from /proc/*/maps)."""
    mapped: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    mapped.add(line.split(None, 5)[-1].replace(" (deleted)", ""))
        except OSError:
            continue
    return mapped


def unlink_all(paths: list[Path]) -> list[Path]:
    """Delete ``paths`` (those already gone or not removable are skipped); returns the ones deleted."""
    removed = []
    for path in paths:
        try:
            path.unlink()
            removed.append(path)
        except OSError:
            continue
    return removed


def remove_unmapped(paths: list[Path]) -> list[Path]:
    """Delete those of ``paths`` (shared-memory files) that no process on this node maps; returns them."""
    if not paths:
        return []
    mapped = mapped_files()
    return unlink_all([p for p in paths if str(p) not in mapped])


def clean_shm(since: float, before: set[str]) -> list[str]:
    """Remove this job's orphaned MPICH segments: ``/dev/shm/mpich_shm_*`` of this user, new since
    ``since`` (not in ``before``), and mapped by no process. Returns the names removed."""
    try:
        candidates = [p for p in SHM.glob("mpich_shm_*") if p.name not in before]
    except OSError:
        return []
    mine = []
    for path in candidates:
        try:
            st = path.stat()
        except OSError:
            continue
        if st.st_uid == os.getuid() and st.st_mtime >= since - 1:
            mine.append(path)
    return [p.name for p in remove_unmapped(mine)]


def _log_hint(env: dict[str, str], rank: int) -> str:
    """`` (its output: PATH)`` when the tasks write per-task log files, else ''."""
    folder = env.get(LOG_DIR_ENV, "")
    found = find_task_log(folder, rank) if folder else None
    return f" (its output: {found})" if found is not None else ""


def supervise(line: Sequence[str], env: dict[str, str], state_dir: str, prog: str) -> int:
    """Run the step ``line`` (whose tasks run under :func:`task_command` with ``CSRUN_JOB_STATE``
    = ``state_dir``) to its end or to the first failed task; the job's exit code (module manual)."""
    try:
        before = {p.name for p in SHM.glob("mpich_shm_*")}
    except OSError:
        before = set()
    started = time.time()
    child = subprocess.Popen(list(line), env={**env, STATE_ENV: state_dir}, start_new_session=True,
                             preexec_fn=die_with_parent(signal.SIGTERM))
    previous = {s: signal.getsignal(s) for s in FORWARDED}

    def forward(signum: int, _frame: object) -> None:
        _signal_group(child.pid, signum)

    try:
        for s in FORWARDED:
            signal.signal(s, forward)
    except ValueError:
        previous = {}
    failed: TaskExit | None = None
    failed_at = 0.0
    terminated_at = 0.0
    try:
        while child.poll() is None:
            time.sleep(POLL_S)
            if failed is None:
                bad = [e for e in read_exits(state_dir) if e.code != 0]
                if bad:
                    failed, failed_at = bad[0], time.monotonic()
                    print(f"{prog}: task rank {failed.rank} on {failed.node or '?'} exited with code {failed.code}; "
                          f"ending the job{_log_hint(env, failed.rank)}", file=sys.stderr, flush=True)
            elif not terminated_at and time.monotonic() - failed_at > GRACE_S:
                _signal_group(child.pid, signal.SIGTERM)
                terminated_at = time.monotonic()
            elif terminated_at and time.monotonic() - terminated_at > KILL_AFTER_S:
                _signal_group(child.pid, signal.SIGKILL)
        _signal_group(child.pid, signal.SIGKILL)  # anything the step left behind in its group
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if child.poll() is None:
            _signal_group(child.pid, signal.SIGKILL)
            child.wait()
        clean_shm(started, before)
        if failed is None:
            failed = next((e for e in read_exits(state_dir) if e.code != 0), None)
            if failed is not None:
                print(f"{prog}: task rank {failed.rank} on {failed.node or '?'} exited with code {failed.code}"
                      f"{_log_hint(env, failed.rank)}", file=sys.stderr, flush=True)
        shutil.rmtree(state_dir, ignore_errors=True)
    if failed is not None:
        return failed.code
    code = child.returncode
    return 128 - code if code < 0 else code
