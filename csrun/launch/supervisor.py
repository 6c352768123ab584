"""The launcher's side of a job: start the step, end the whole job when any task fails, clean up.

csrun_wse (local ``mpiexec`` and Slurm ``srun`` alike) runs its step through :func:`supervise`:

- every task runs under :mod:`csrun.launch.task`, which writes ``exit.<rank>`` (its command's
  own exit code and its node) into the job's state folder (``CSRUN_JOB_STATE``) however the
  command ends, before or after MPI init, in user code or in csrun's own exit hooks;
- the step's launcher (mpiexec or srun) runs in its own process group and dies with csrun_wse
  (``PR_SET_PDEATHSIG``, SIGTERM: srun then ends the step, mpiexec passes it on and removes its
  own files); each task's wrapper watches csrun_wse itself where it can see it and ends its
  command the moment csrun_wse dies, so that a ``kill -9`` of csrun_wse leaves no task running
  (:mod:`csrun.launch.task`); and a watch started beside csrun_wse removes what the job left on
  this node at once (:func:`csrun.launch.reaper.start_watch`);
- the supervisor watches the folder and, on this node, the tasks' processes themselves
  (:mod:`csrun.task_exits`). At the first failure -- the earliest-ending task whose code is not
  0, known from its last word, its report or (ended without either) 137 -- it prints one line,
  ``csrun_wse: task rank R on NODE exited with code C; ending the job``, gives the step
  :data:`GRACE_S` to end by itself (srun's ``--kill-on-bad-exit``, mpiexec's own abort), then
  SIGTERMs its process group and SIGKILLs it :data:`KILL_AFTER_S` later. The job's exit code is
  that task's own code, every time (a crash's 1 or 3, not srun's 137/143, nor the consequential
  error of a task that lost its peer); without any failure it is the step's;
- a planned stop is no failure: a run that was asked to stop and saved its checkpoint announces
  its code (:func:`csrun.task_exits.planned_stop`; ``128 + signal``), its wrapper tells mpiexec or
  srun 0, and the supervisor names nobody and prints nothing more: the job's code is the stop's.
  Tasks still running :data:`STOP_GRACE_S` after it are ended as after a failure;
- signals at csrun_wse (:class:`Stop`; the same locally and under Slurm): SIGINT (Ctrl-C),
  SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 each ask the job to stop: one line says so, and the step
  gets the preemption signal (``CSRUN_PREEMPT_SIGNAL``: a training run.py saves a checkpoint at
  its next step and stops; the streamers and a cluster's systems and MemoryX ignore it and wait
  for the chief's word). Locally it goes to each task's command itself (mpiexec would die of
  SIGHUP or SIGUSR2, and it SIGTERMs every task); under Slurm to srun, which passes it to every
  task (srun ends the step on SIGTERM: with ``CSRUN_PREEMPT_SIGNAL=TERM`` a stop at the launcher
  ends the step unsaved, so keep USR1 or USR2 under srun). A Ctrl-C while a stop is under way
  stops the job at once.
  The job then exits ``128 + the signal`` (130 for Ctrl-C; 0 if it ended cleanly all the same);
- on a terminal the launcher draws the chief's progress bar below the step's output
  (:mod:`csrun.launch.live_bar`);
- whatever the ending, MPICH's shared-memory segments that this job left in ``/dev/shm``
  (``mpich_shm_*`` owned by this user, created after the step started and mapped by no
  process any more) are removed on this node.

The state folder is made in the working directory (``.csrun_job.<random>``, which Slurm
nodes usually share with the submitting one) under Slurm, in the temporary folder otherwise,
and removed at the end; its ``owner`` file names the launcher (:mod:`csrun.launch.owner`), for
the tasks' wrappers, the watch, and the next launch, which removes the folders and other
leftovers of launchers that are gone (:mod:`csrun.launch.reaper`). Where the working directory is not shared, exit reports from other
nodes do not arrive: the job then ends by srun's own means, with srun's exit code. Other
nodes' ``/dev/shm`` is left to Slurm's epilog.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from csrun.cluster import cluster_role
from csrun.env_settings import NUM_CSX
from csrun.launch.live_bar import LiveBar, same_terminal
from csrun.launch.live_bar import wanted as live_bar_wanted
from csrun.launch.owner import write_owner
from csrun.launch.preempt_signal import preemption_signal
from csrun.launch.process import PASSED_ON, die_with_parent
from csrun.launch.reaper import clean_shm, note_shm_before, shm_names, start_watch
from csrun.launch.task import STATE_ENV
from csrun.task_exits import TaskExit, TaskWatch
from csrun.launch.task_log import LOG_DIR_ENV, find_task_log

GRACE_S = 2.0
"""Seconds the step gets to end by itself after a task failed, before it is terminated."""
KILL_AFTER_S = 3.0
"""Seconds between SIGTERM and SIGKILL of the step's process group."""
STOP_GRACE_S = 30.0
"""Seconds the other tasks get to end by themselves after a planned stop, before they are terminated."""
POLL_S = 0.1
STOPPED_CODES = (128 + signal.SIGTERM, 128 + signal.SIGINT, 128 + signal.SIGKILL, 128 + signal.SIGUSR1,
                 128 + signal.SIGUSR2, 128 + signal.SIGHUP)
"""Task codes that, after a stop signal at the launcher, are the stop asked for rather than a failure
(a script of the user's own without a handler for it ends so)."""


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
    write_owner(folder)
    return folder


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _log_hint(env: dict[str, str], rank: int) -> str:
    """`` (its output: PATH)`` when the tasks write per-task log files, else ''."""
    folder = env.get(LOG_DIR_ENV, "")
    found = find_task_log(folder, rank) if folder else None
    return f" (its output: {found})" if found is not None else ""


def supervise(line: Sequence[str], env: dict[str, str], state_dir: str, prog: str) -> int:
    """Run the step ``line`` (whose tasks run under :func:`task_command` with ``CSRUN_JOB_STATE``
    = ``state_dir``) to its end, to the first failed task or to a planned stop; the job's exit code (module manual)."""
    before = shm_names()
    note_shm_before(state_dir, before)
    _watches.append(start_watch(state_dir))
    started = time.time()
    draw = live_bar_wanted(env)
    with_stderr = draw and same_terminal()
    child = subprocess.Popen(list(line), env={**env, STATE_ENV: state_dir}, start_new_session=True,
                             preexec_fn=die_with_parent(signal.SIGTERM), stdout=subprocess.PIPE if draw else None,
                             stderr=subprocess.PIPE if with_stderr else None)
    bar = LiveBar(state_dir, with_stderr=with_stderr) if draw else None
    pumps = [bar.pump(pipe) for pipe in (child.stdout, child.stderr) if pipe is not None] if bar is not None else []
    watch = TaskWatch(state_dir)
    if Path(line[0]).name == "srun":  # srun passes the preemption signal on to every task; SIGINT ends the step
        stop = Stop(prog, ask=lambda sig: _signal_group(child.pid, sig),
                    at_once=lambda: _signal_group(child.pid, signal.SIGINT))
    else:  # mpiexec would die of SIGHUP or SIGUSR2 (and SIGTERMs every task): each command gets it itself
        stop = Stop(prog, ask=watch.signal_commands, at_once=lambda: _signal_group(child.pid, signal.SIGKILL))
    previous = {s: signal.getsignal(s) for s in PASSED_ON}
    try:
        for s in PASSED_ON:
            signal.signal(s, stop.received)
    except ValueError:
        previous = {}
    ended: TaskExit | None = None
    ended_at = 0.0
    terminated_at = 0.0
    try:
        while child.poll() is None:
            watch.wait(POLL_S)
            stop.act()
            if bar is not None:
                bar.refresh()
            if ended is None:
                ended = watch.first_end()
                if ended is not None:
                    ended_at = time.monotonic()
                    if not ended.planned:
                        _say_failed(prog, ended, env, stop, ending=True)
            elif not terminated_at and time.monotonic() - ended_at > (STOP_GRACE_S if ended.planned else GRACE_S):
                _signal_group(child.pid, signal.SIGTERM)
                terminated_at = time.monotonic()
            elif terminated_at and time.monotonic() - terminated_at > KILL_AFTER_S:
                _signal_group(child.pid, signal.SIGKILL)
        _signal_group(child.pid, signal.SIGKILL)  # anything the step left behind in its group
    finally:  # the handlers stay until the clean-up is done: a Ctrl-C meanwhile is noted, not a KeyboardInterrupt
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
            if ended is None:
                ended = watch.first_end(final=True)
                if ended is not None and not ended.planned:
                    _say_failed(prog, ended, env, stop, ending=False)
            shutil.rmtree(state_dir, ignore_errors=True)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    code = child.returncode
    return stop.exit_code(ended.code if ended is not None else (128 - code if code < 0 else code))


_watches: list[subprocess.Popen[bytes] | None] = []
"""The watches started (:func:`csrun.launch.reaper.start_watch`): each ends by itself after this process."""


def _say_failed(prog: str, failed: TaskExit, env: dict[str, str], stop: "Stop", *, ending: bool) -> None:
    if stop.signum is not None and failed.code in STOPPED_CODES:
        return  # the stop that was asked for, not a failure
    how = f"exited with code {failed.code}" if failed.reported else f"was killed (code {failed.code}; no report from its wrapper)"
    how += f" ({failed.cause})" if failed.cause else ""
    tail = "; ending the job" if ending else ""
    systems = env.get(NUM_CSX.name, "").strip()
    role = cluster_role(failed.rank, int(systems)) if systems.isdigit() else ""
    who = f"task rank {failed.rank}" + (f" ({role})" if role else "")
    print(f"{prog}: {who} on {failed.node or '?'} {how}{tail}{_log_hint(env, failed.rank)}",
          file=sys.stderr, flush=True)


class Stop:
    """Stop signals at the launcher (:data:`~csrun.launch.process.PASSED_ON`), the same locally and
    under Slurm: the first asks the step to checkpoint and stop (``ask`` with the preemption signal,
    ``CSRUN_PREEMPT_SIGNAL``: the runner's "checkpoint at the next step and stop"); a Ctrl-C after
    it stops the step at once (``at_once``: SIGKILL of mpiexec's group; for srun, SIGINT, which
    ``--quit-on-interrupt`` makes srun's immediate end of the step); other signals after the first
    change nothing. The handler (:meth:`received`) only notes a signal; :meth:`act`, called by the
    supervisor's loop, acts on it."""

    def __init__(self, prog: str, *, ask: Callable[[int], None], at_once: Callable[[], None]) -> None:
        self.prog = prog
        self.signum: int | None = None
        """The first stop signal the launcher received (None: none)."""
        self._ask = ask
        self._at_once = at_once
        self._hurried = False
        self._received: list[int] = []

    def received(self, signum: int, _frame: object = None) -> None:
        """A stop signal at the launcher (the signal handler)."""
        self._received.append(signum)

    def act(self) -> None:
        """Act on the signals received since the last call (module docstring)."""
        while self._received:
            signum = self._received.pop(0)
            if self.signum is None:
                self.signum = signum
                if signum == signal.SIGINT:
                    print(f"\n{self.prog}: interrupted: the job stops (a training run.py saves a checkpoint at its next "
                          "step first); Ctrl-C again stops it at once, saving nothing more", file=sys.stderr, flush=True)
                else:
                    print(f"{self.prog}: {signal.Signals(signum).name}: the job stops (a training run.py saves a "
                          "checkpoint at its next step first)", file=sys.stderr, flush=True)
                self._ask(preemption_signal())
            elif signum == signal.SIGINT and not self._hurried:
                self._hurried = True
                print(f"\n{self.prog}: interrupted again: stopping the job now", file=sys.stderr, flush=True)
                self._at_once()

    def exit_code(self, code: int) -> int:
        """The job's exit code, the step's being ``code``: ``128 +`` the first stop signal unless the
        job ended cleanly all the same (0)."""
        return 128 + self.signum if self.signum is not None and code != 0 else code
