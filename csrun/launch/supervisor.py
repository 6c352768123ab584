"""The launcher's side of a job: start the step, end the whole job when any task fails, clean up.

csrun_wse (local ``mpiexec`` and Slurm ``srun`` alike) runs its step through :func:`supervise`:

- every task runs under :mod:`csrun.launch.task`, which writes ``exit.<rank>`` (its command's
  own exit code and its node) into the job's state folder (``CSRUN_JOB_STATE``) however the
  command ends, before or after MPI init, in user code or in csrun's own exit hooks;
- the step's launcher (mpiexec or srun) runs in its own process group and dies with csrun_wse
  (``PR_SET_PDEATHSIG``: a ``kill -9`` of csrun_wse takes mpiexec, srun, the tasks and a job's
  emulator along);
- the supervisor watches the folder and, on this node, the tasks' processes themselves
  (:mod:`csrun.task_exits`). At the first failure -- the earliest-ending task whose code is not
  0, known from its last word, its report or (ended without either) 137 -- it prints one line,
  ``csrun_wse: task rank R on NODE exited with code C; ending the job``, gives the step
  :data:`GRACE_S` to end by itself (srun's ``--kill-on-bad-exit``, mpiexec's own abort), then
  SIGTERMs its process group and SIGKILLs it :data:`KILL_AFTER_S` later. The job's exit code is
  that task's own code, every time (a crash's 1 or 3, not srun's 137/143, nor the consequential
  error of a task that lost its peer; a preempted chief's 128+signal stays as it is); without
  any failure it is the step's;
- Ctrl-C (SIGINT at the launcher) is the same locally and under Slurm (:class:`Interrupt`): the
  first asks the job to stop (a training run.py saves a checkpoint at its next step first), a
  second stops it at once;
  either way the job exits 130 (0 if it ended cleanly all the same). Other signals
  (SIGTERM, SIGHUP, SIGUSR1/2) are passed on to the step as they are;
- on a terminal the launcher draws the chief's progress bar below the step's output
  (:mod:`csrun.launch.live_bar`);
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
from pathlib import Path
from typing import Sequence

from csrun.cluster import cluster_role
from csrun.env_settings import NUM_CSX
from csrun.launch.live_bar import LiveBar, same_terminal
from csrun.launch.live_bar import wanted as live_bar_wanted
from csrun.launch.preempt_signal import preemption_signal
from csrun.launch.process import die_with_parent
from csrun.launch.task import STATE_ENV
from csrun.task_exits import TaskExit, TaskWatch
from csrun.launch.task_log import LOG_DIR_ENV, find_task_log

GRACE_S = 2.0
"""Seconds the step gets to end by itself after a task failed, before it is terminated."""
KILL_AFTER_S = 3.0
"""Seconds between SIGTERM and SIGKILL of the step's process group."""
POLL_S = 0.1
INTERRUPTED = 130
"""The job's exit code after a Ctrl-C (the shell's 128 + SIGINT), unless it ended cleanly anyway."""
STOPPED_CODES = (128 + signal.SIGTERM, 128 + signal.SIGINT, 128 + signal.SIGKILL, 128 + signal.SIGUSR1, 128 + signal.SIGUSR2)
"""Task codes that, after a Ctrl-C, are the stop the user asked for rather than a failure."""
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
SHM = Path("/dev/shm")
OWNER = "owner"
"""The file in a state folder naming its launcher, ``<pid> <host>`` (:mod:`csrun.launch.reaper` reads it)."""


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
    draw = live_bar_wanted(env)
    with_stderr = draw and same_terminal()
    child = subprocess.Popen(list(line), env={**env, STATE_ENV: state_dir}, start_new_session=True,
                             preexec_fn=die_with_parent(signal.SIGTERM), stdout=subprocess.PIPE if draw else None,
                             stderr=subprocess.PIPE if with_stderr else None)
    bar = LiveBar(state_dir, with_stderr=with_stderr) if draw else None
    pumps = [bar.pump(pipe) for pipe in (child.stdout, child.stderr) if pipe is not None] if bar is not None else []
    interrupt = Interrupt(prog, child.pid, is_srun=Path(line[0]).name == "srun")
    previous = {s: signal.getsignal(s) for s in FORWARDED}

    def forward(signum: int, _frame: object) -> None:
        if signum == signal.SIGINT:
            interrupt.pressed()
        else:
            _signal_group(child.pid, signum)

    try:
        for s in FORWARDED:
            signal.signal(s, forward)
    except ValueError:
        previous = {}
    watch = TaskWatch(state_dir)
    failed: TaskExit | None = None
    failed_at = 0.0
    terminated_at = 0.0
    try:
        while child.poll() is None:
            watch.wait(POLL_S)
            if bar is not None:
                bar.refresh()
            if failed is None:
                failed = watch.first_failure()
                if failed is not None:
                    failed_at = time.monotonic()
                    _say_failed(prog, failed, env, interrupt, ending=True)
            elif not terminated_at and time.monotonic() - failed_at > GRACE_S:
                _signal_group(child.pid, signal.SIGTERM)
                terminated_at = time.monotonic()
            elif terminated_at and time.monotonic() - terminated_at > KILL_AFTER_S:
                _signal_group(child.pid, signal.SIGKILL)
        _signal_group(child.pid, signal.SIGKILL)  # anything the step left behind in its group
    finally:  # a Ctrl-C during the clean-up is still this job's (a second press: "stopping now")
        try:
            if child.poll() is None:
                _signal_group(child.pid, signal.SIGKILL)
                child.wait()
            watch.wait(0)  # ends that came with the step's
            watch.close()
            for pump in pumps:  # the step's last lines (a straggler holding a pipe: bounded wait)
                pump.join(timeout=2.0)
            if bar is not None:
                bar.stop()
            clean_shm(started, before)
            if failed is None:
                failed = watch.first_failure(final=True)
                if failed is not None:
                    _say_failed(prog, failed, env, interrupt, ending=False)
            shutil.rmtree(state_dir, ignore_errors=True)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    code = child.returncode
    code = failed.code if failed is not None else (128 - code if code < 0 else code)
    return INTERRUPTED if interrupt.count and code != 0 else code


def _say_failed(prog: str, failed: TaskExit, env: dict[str, str], interrupt: "Interrupt", *, ending: bool) -> None:
    if interrupt.count and failed.code in STOPPED_CODES:
        return  # the stop the user asked for, not a failure
    how = f"exited with code {failed.code}" if failed.reported else f"was killed (code {failed.code}; no report from its wrapper)"
    how += f" ({failed.cause})" if failed.cause else ""
    tail = "; ending the job" if ending else ""
    systems = env.get(NUM_CSX.name, "").strip()
    role = cluster_role(failed.rank, int(systems)) if systems.isdigit() else ""
    who = f"task rank {failed.rank}" + (f" ({role})" if role else "")
    print(f"{prog}: {who} on {failed.node or '?'} {how}{tail}{_log_hint(env, failed.rank)}",
          file=sys.stderr, flush=True)


class Interrupt:
    """Ctrl-C at the launcher, the same locally and under Slurm: the first asks the step to
    checkpoint and stop (the preemption signal, ``CSRUN_PREEMPT_SIGNAL``: the runner's "checkpoint
    at the next step and stop", which srun passes on to the tasks where it would end the step on
    SIGTERM); a second stops it at once (SIGKILL of mpiexec's group; for srun, SIGINT, which
    ``--quit-on-interrupt`` makes srun's immediate end of the step)."""

    def __init__(self, prog: str, pgid: int, *, is_srun: bool) -> None:
        self.prog = prog
        self.pgid = pgid
        self.is_srun = is_srun
        self.count = 0

    def pressed(self) -> None:
        """One Ctrl-C (SIGINT) at the launcher."""
        self.count += 1
        if self.count == 1:
            print(f"\n{self.prog}: interrupted: the job stops (a training run.py saves a checkpoint at its next step "
                  "first); Ctrl-C again stops it at once, saving nothing more", file=sys.stderr, flush=True)
            _signal_group(self.pgid, preemption_signal())
        else:
            print(f"\n{self.prog}: interrupted again: stopping the job now", file=sys.stderr, flush=True)
            _signal_group(self.pgid, signal.SIGINT if self.is_srun else signal.SIGKILL)
