"""Running one command: a child process with signals passed on, a body with user errors as one line.

:func:`run_child` runs an argv to its end and returns its exit code (128+N for signal N),
forwarding SIGINT/SIGTERM/SIGHUP/SIGUSR1/SIGUSR2 so Slurm's preemption signals reach the
training script. It waits in :func:`wait_child`, where a forwarded signal is passed on at once
whichever of this process's threads the kernel handed it to (a blocking ``wait()`` would hold
it until the child ended), and where the child can be tied to another process's life (a task
to its launcher's: ``until``). The child dies with this process: it is started with ``PR_SET_PDEATHSIG``
(:func:`die_with_parent`), so a launcher or wrapper killed with SIGKILL takes its child along
(mpiexec, srun, a task) instead of leaving it running. :func:`run_cli` runs a command's body and turns a
:class:`~csrun.errors.UserError` into ``prog: error: ...`` on stderr and its exit code.
Both live here, in ``launch/``, because launch wrappers (``python -m
csrun.launch.job_emulator``) are commands too; :mod:`csrun.cli.common` re-exports them.
"""

from __future__ import annotations

import ctypes
import os
import select
import selectors
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence

from csrun.consoles import whole_lines
from csrun.errors import UserError
from csrun.launch.task_log import TaskLog, copy_lines, unbuffered

PR_SET_PDEATHSIG = 1
PUMP_DRAIN_S = 2.0
"""How long :func:`run_child` waits, after the child ended, for its last logged lines."""
WAIT_POLL_S = 0.2
""":func:`wait_child`'s polling interval where it cannot sleep on the child (off the main thread, no pidfd)."""
PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""The signals a launcher or wrapper passes on to its child (a job's stop signals: Ctrl-C, Slurm's
and the batch systems' preemption and termination signals, a closed terminal)."""


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child receive ``sig`` when its parent dies (Linux; a no-op
    where prctl is missing)."""

    def preexec() -> None:
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))
        except (OSError, AttributeError):
            pass

    return preexec


def _preexec(parent_death: int, ignored: Sequence[int]) -> Callable[[], None]:
    dies = die_with_parent(parent_death)

    def preexec() -> None:
        dies()
        for sig in ignored:
            signal.signal(sig, signal.SIG_IGN)

    return preexec


def wait_child(child: subprocess.Popen[bytes], until: int | None = None) -> int:
    """``child.wait()``, during which this process's signal handlers run as soon as a signal arrives;
    ``until``: a file descriptor (a pidfd) whose becoming readable ends the child (SIGKILL) first.

    The kernel gives a process-directed signal to any thread that does not block it. In a
    blocking ``wait()`` the main thread sleeps in ``waitpid``, and a signal that went to another
    thread (a log pump) only sets Python's flag: its handler runs when the child has ended.
    This happens when two signals arrive close together, as when Slurm sends submitit's
    preemption signal and submitit then sends ours. So a forwarded preemption signal would be
    lost. Here the main thread sleeps in ``select`` on the child's pidfd and on a wake-up pipe
    that Python's C-level handler writes, whichever thread took the signal. Handlers run at once,
    and no lock of the Popen is held while waiting, so a handler may wait for the child itself.
    Off the main thread, or without ``pidfd_open``, it polls every :data:`WAIT_POLL_S`.
    """
    if child.returncode is not None:  # reaped already (a handler may have waited for it): its pid may be another's
        return child.returncode
    if threading.current_thread() is not threading.main_thread() or not hasattr(os, "pidfd_open"):
        return _poll_child(child, until)  # only the main thread may set the wake-up fd
    try:
        pidfd = os.pidfd_open(child.pid)
    except OSError:  # the child was reaped meanwhile
        return _poll_child(child, until)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    previous = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(pidfd, selectors.EVENT_READ)
            selector.register(wake_read, selectors.EVENT_READ)
            if until is not None:
                selector.register(until, selectors.EVENT_READ)
            while True:
                ready = {key.fd for key, _ in selector.select()}
                if pidfd in ready:
                    break
                _drain(wake_read)  # a signal: its handler has run by the next line of Python
                if until in ready:
                    selector.unregister(until)
                    child.kill()
    finally:
        signal.set_wakeup_fd(previous)
        for fd in (pidfd, wake_read, wake_write):
            os.close(fd)
    return child.wait()


def _poll_child(child: subprocess.Popen[bytes], until: int | None = None) -> int:
    while (code := child.poll()) is None:
        if until is not None and select.select([until], [], [], 0)[0]:
            child.kill()
            return child.wait()
        time.sleep(WAIT_POLL_S)
    return code


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def ignore_late_ctrl_c() -> None:
    """The command is over (it chose its exit code): a Ctrl-C arriving while the interpreter exits
    (a person's second press as the work finished) changes nothing, where Python would print a
    traceback from its shutdown or die by SIGINT in place of that code. Main thread only; elsewhere nothing."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        pass


def run_cli(prog: str, body: Callable[[list[str]], int], argv: Sequence[str] | None) -> int:
    """Run a command's body on ``argv`` (default ``sys.argv[1:]``), each line it prints one write
    (:func:`~csrun.consoles.whole_lines`); a :class:`UserError` becomes
    ``prog: error: ...`` on stderr and its exit code. ``--version`` as the first word prints
    ``prog (csrun X.Y.Z)`` and exits 0."""
    whole_lines()
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["--version"]:
        import csrun

        print(f"csrun {csrun.__version__}" if prog == "csrun" else f"{prog} (csrun {csrun.__version__})", flush=True)
        return 0
    try:
        return body(args)
    except SystemExit as exc:  # argparse's --help / --version, or the body's own exit: its code
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr, flush=True)  # sys.exit("message"), as Python would show it
        return 1
    except UserError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return 130


def run_child(argv: Sequence[str], env: dict[str, str], *, keep_fds: bool = False,
              parent_death: int = signal.SIGTERM, log: TaskLog | None = None, log_header: str = "",
              started: Callable[[int], None] | None = None, label: str = "", ignored: Sequence[int] = (),
              until: int | None = None) -> int:
    """Run ``argv`` to the end, passing :data:`PASSED_ON` (SIGINT/SIGTERM/SIGHUP/SIGUSR1/SIGUSR2) on to it; its exit code (128+N for signal N).

    ``keep_fds``: the child inherits every open file descriptor (an MPI task needs the PMI
    socket srun gave this process, named by ``PMI_FD``). ``parent_death``: the signal the child
    gets if this process dies first. ``log``: the child's stdout and stderr go through pipes
    into that file (and onto this process's own when it echoes; :mod:`csrun.launch.task_log`),
    the file starting with ``log_header``; a file that cannot be opened is said in one line on
    stderr and the output goes straight through. ``started``: called with the child's pid once it runs.
    ``label`` (without ``log``): every line of the child's output reaches this process's stdout or
    stderr after ``label`` (``[rank 1] ``). ``ignored``: signals the child starts with ignored (it
    inherits that across ``exec``, before its own code runs). ``until``: see :func:`wait_child`
    (the child is SIGKILLed when it becomes readable: exit code 137).
    """
    log_file = None
    if log is not None:
        try:
            log_file = log.open(log_header)
        except OSError as exc:
            print(f"csrun: cannot write the task log {log.path}: {exc.strerror or exc}; output goes to the console only",
                  file=sys.stderr, flush=True)
    labelled = bool(label) and log is None
    piped = subprocess.PIPE if log_file is not None or labelled else None
    child = subprocess.Popen(list(argv), env=unbuffered(env) if piped else env, close_fds=not keep_fds,
                             preexec_fn=_preexec(parent_death, ignored), stdout=piped, stderr=piped)
    if started is not None:
        started(child.pid)
    pumps = []
    if log is not None and log_file is not None and child.stdout is not None and child.stderr is not None:
        lock = threading.Lock()
        pumps = [log.pump(child.stdout, log_file, sys.stdout.buffer if log.echo else None, lock),
                 log.pump(child.stderr, log_file, sys.stderr.buffer if log.echo else None, lock)]
    elif labelled and child.stdout is not None and child.stderr is not None:
        prefix = label.encode()
        pumps = [copy_lines(child.stdout, [(sys.stdout.buffer, prefix, None)], "csrun-label-stdout"),
                 copy_lines(child.stderr, [(sys.stderr.buffer, prefix, None)], "csrun-label-stderr")]
    previous = {s: signal.getsignal(s) for s in PASSED_ON}

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    try:
        for s in PASSED_ON:
            signal.signal(s, forward)
    except ValueError:  # not the main thread: signals stay as they are
        previous = {}
    try:
        code = wait_child(child, until)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for pump in pumps:  # a grandchild may hold the pipe open: bounded wait
            pump.join(timeout=PUMP_DRAIN_S)
        if log_file is not None:
            log_file.close()
    return 128 - code if code < 0 else code
