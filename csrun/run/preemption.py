"""Preemption: SIGTERM or the preemption signal on the chief mean "checkpoint and stop at the next step".

The preemption signal is ``CSRUN_PREEMPT_SIGNAL`` (default SIGUSR1; see
:mod:`csrun.launch.preempt_signal`, which the launchers read too). On the chief,
:class:`Preemption` installs handlers that only set a flag. The training loop checks it at
every step boundary (in the step closure, after the loss checks): it saves
``checkpoint_<step>.mdl`` (unless that step was just saved), leaves the Session (which stops
the streamers) and run() returns ``128 + signal number`` — 143 for SIGTERM, 138 for SIGUSR1,
140 for SIGUSR2 — the shell's convention for "ended by this signal". A batch job that asked
for ``#SBATCH --signal=B:USR1@60`` requeues itself on that exit code and continues with
``--resume``. A second signal of the same kind while the first is pending is ignored.

Ctrl-C (SIGINT) on the chief means the same while it trains, under any launcher or none: the
first says in one line that the run saves a checkpoint at its next step and stops (exit 130,
not requeued, not counted as a fruitless preemption); a second, while that is pending, is
Python's KeyboardInterrupt (stop at once, exit 130, nothing more saved). The same SIGINT twice
within :data:`SAME_CTRL_C_S` counts once (a terminal signals the launcher's whole group, and a
launcher passes its copy on). Outside the training loop (setup, a compile, eval) Ctrl-C stops at
once. So does SIGTERM (unless it is the preemption signal, ``CSRUN_PREEMPT_SIGNAL=TERM``): there
is no step to checkpoint at, and a build or compile that runs on (a model too big to build, a
compile of minutes) must not outlive a ``scancel`` or a time limit; the run ends with one line,
exit 143 (:class:`Terminated`). ``csrun_wse`` turns its own Ctrl-C (and SIGTERM, SIGHUP, SIGUSR1,
SIGUSR2) into the preemption signal for the step (:class:`csrun.launch.supervisor.Stop`), so the
tasks see the same meaning there.

A run that stopped so says beforehand that its exit code is a planned stop
(:func:`announce_stop`, :func:`csrun.task_exits.planned_stop`): under csrun_wse the job then
ends without naming a task as failed, without ``MPI_Abort`` and without mpiexec's ``BAD
TERMINATION`` banner, and exits with that code.

Requeues that gain nothing: :func:`account_preemption` counts, in ``model_dir``'s
:data:`IDLE_FILE`, the preemptions in a row that ended a run without a gained step (a time
limit too short for the compile and one checkpoint interval would otherwise requeue forever).
At ``CSRUN_MAX_IDLE_REQUEUES`` (default 3) the run stops asking to be requeued: one line, exit
1, which neither launcher requeues. A run that gains a step, or completes, clears the count.
The preemption signal arriving before the first step (during setup) stops the run there, without
a checkpoint, as a preemption that gained no step.

Asking to be requeued: the batch script of ``csrun_wse --use-sbatch`` sets
``CSRUN_REQUEUE_FILE``; a run that stopped for a preemption (and is under the cap) writes its
global step there (:func:`ask_to_requeue`), and the script requeues only then, so a command
that was simply killed by the signal (exit code ``128 + signal`` as well) is not requeued.

On streamers the preemption signals and SIGINT are ignored while they stream: Slurm signals every task of the
step, and a streamer that died first would make the chief's last step fail; the chief
stops them when it has saved. (A streamer left without its chief ends on its stream
timeout.)
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from csrun.cluster import cluster_info
from csrun.env_settings import REQUEUE_FILE
from csrun.errors import UserError
from csrun.files import atomic_write
from csrun.launch.preempt_signal import MAX_IDLE_REQUEUES_ENV, max_idle_requeues, preemption_signal
from csrun.task_exits import planned_stop

REQUEUE_FILE_ENV = REQUEUE_FILE.name
"""Set by ``csrun_wse --use-sbatch``'s batch script: where a preempted run says "requeue me"."""
SAME_CTRL_C_S = 0.25
"""Two SIGINTs closer than this are one Ctrl-C (a terminal's and a launcher's copy come within
milliseconds; a person's second press comes later)."""
IDLE_FILE = ".csrun_idle_preemptions"
"""In model_dir: how many preemptions in a row ended a run without a gained step."""


def preemption_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM and ``CSRUN_PREEMPT_SIGNAL`` (one entry when they are the same)."""
    return tuple(dict.fromkeys((signal.SIGTERM, preemption_signal())))


class Preempted(Exception):
    """Raised at a step boundary after the preemption checkpoint was written."""

    def __init__(self, signum: int, step: int, *, saved: bool = True) -> None:
        self.signum = signum
        self.step = step
        self.saved = saved
        """A checkpoint of ``step`` was written (False: stopped before the first step)."""
        super().__init__(f"stopped by {signal.Signals(signum).name} at global step {step}")

    @property
    def exit_code(self) -> int:
        """``128 + signum`` (143 for SIGTERM, 138 for SIGUSR1, 140 for SIGUSR2)."""
        return 128 + self.signum


class Terminated(SystemExit):
    """SIGTERM outside a training loop (setup, a model's build, a compile, eval): the run stops at
    once, saving nothing, exit 143 (``128 + SIGTERM``). A :class:`SystemExit`, so that no
    ``except Exception`` on the way (a library's, a user's) turns it into another error; the
    line saying why is printed as it is raised."""

    def __init__(self) -> None:
        prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "run.py"
        print(f"{prog}: stopped by SIGTERM outside the training loop (setup, compile or eval): nothing saved; "
              f"continue with --resume", file=sys.stderr, flush=True)
        super().__init__(128 + signal.SIGTERM)


class Preemption:
    """Signal flag for the chief (use as a context manager around the training loop)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.stops_at_steps = False
        """True while a training loop checks the flag at its step boundaries (the runner sets it
        around the loop); elsewhere (setup, compile, eval) Ctrl-C is Python's KeyboardInterrupt."""
        self._interrupted_at = 0.0
        self._old: dict[int, object] = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM and not self.stops_at_steps and signum != preemption_signal():
            raise Terminated()  # no step to stop at: a build, a compile or an eval that must not run on
        if signum == signal.SIGINT:
            now = time.monotonic()
            if self._interrupted_at and now - self._interrupted_at < SAME_CTRL_C_S:
                return  # the same Ctrl-C twice: the terminal's, and a launcher's copy of it
            if self.signum is not None or not self.stops_at_steps:  # a second Ctrl-C, or no step to stop at
                raise KeyboardInterrupt
            self._interrupted_at = now
            print("\ninterrupted (Ctrl-C): saving a checkpoint at the next step, then stopping "
                  "(Ctrl-C again stops at once)", file=sys.stderr, flush=True)
        if self.signum is None:
            self.signum = signum

    @property
    def requested(self) -> bool:
        """True once a preemption signal arrived."""
        return self.signum is not None

    def __enter__(self) -> "Preemption":
        for sig in (*preemption_signals(), signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread: no handlers, no preemption
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        self._old.clear()


def ignore_on_streamer() -> None:
    """Streamers: ignore the preemption signals and Ctrl-C (the chief stops them after its checkpoint)."""
    for sig in (*preemption_signals(), signal.SIGINT):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except ValueError:
            pass


class RequeueCapReached(UserError):
    """Preempted too often in a row without a gained step: the run stops asking to be requeued."""

    exit_code = 1


def _read_count(path: Path) -> int:
    try:
        text = path.read_text().strip()
    except (FileNotFoundError, OSError, UnicodeDecodeError):
        return 0
    return int(text) if text.isdigit() else 0


def account_preemption(model_dir: Path, start_step: int, preempted: Preempted) -> None:
    """Count a preemption that gained no step since ``start_step`` (clear the count when one was
    gained); raise :class:`RequeueCapReached` at ``CSRUN_MAX_IDLE_REQUEUES`` in a row."""
    path = Path(model_dir) / IDLE_FILE
    if preempted.step > start_step:
        clear_idle_preemptions(model_dir)
        return
    cap = max_idle_requeues()
    count = _read_count(path) + 1
    atomic_write(path, f"{count}\n")
    if count >= cap:
        raise RequeueCapReached(
            f"preempted {count} times in a row without gaining a step (still at global step {preempted.step}); "
            f"checkpoint kept, not asking to be requeued again: give the job a longer time limit or a smaller "
            f"checkpoint_steps, or raise {MAX_IDLE_REQUEUES_ENV} (now {cap}); delete {path} to start counting again")


def ask_to_requeue(preempted: Preempted) -> None:
    """Tell the batch script that asked (``CSRUN_REQUEUE_FILE``) that this run stopped for a
    preemption as it should and may be requeued: the file gets the global step."""
    target = os.environ.get(REQUEUE_FILE_ENV, "").strip()
    if not target or preempted.signum == signal.SIGINT:  # Ctrl-C: stopped by hand, not to be requeued
        return
    try:
        Path(target).write_text(f"{preempted.step}\n")
    except OSError as exc:  # the job then ends without a requeue: say why
        print(f"csrun: cannot write {REQUEUE_FILE_ENV}={target}: {exc}; the job will not be requeued", flush=True)


def announce_stop(preempted: Preempted) -> None:
    """The run is about to exit with ``preempted.exit_code`` as it was asked to: tell the job's
    launcher and MPI that this code is a planned stop, not a failure (:func:`csrun.task_exits.planned_stop`)."""
    info = cluster_info()
    planned_stop(preempted.exit_code, info.rank, info.node_name, str(preempted))


def clear_idle_preemptions(model_dir: Path) -> None:
    """A run gained a step or completed: forget earlier fruitless preemptions."""
    (Path(model_dir) / IDLE_FILE).unlink(missing_ok=True)
