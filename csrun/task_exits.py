"""Which task of a csrun_wse job failed first, or stopped as planned: the tasks' reports, and the ends the launcher saw itself.

The files of the job's state folder (``CSRUN_JOB_STATE``), written by the tasks and read by the
launcher's supervisor (:mod:`csrun.launch.supervisor`). Every task's wrapper (:mod:`csrun.launch.task`) writes two files into the job's state folder:

- ``start.<rank>`` when its command started: ``<pid> <wrapper pid> <pid namespace> <host>
  <node>``, the command's process and the wrapper's as this node's kernel numbers them;
- ``exit.<rank>`` when its command ended, however it ended: ``<exit code> <node> <time>``.

The chief's runner also keeps ``progress`` there (``<step> <total> <loss> <samples/s> <eta s>``,
rewritten a few times a second: :func:`report_progress`), from which a launcher on a terminal
draws the bar (:mod:`csrun.launch.live_bar`).

Tasks write only these plain lines; the launcher reads them as untrusted text (numbers parsed,
the cause kept as one printable line of at most :data:`CAUSE_MAX` characters).

A task that uses csrun's API also leaves a last word, ``last.<rank>`` (the same, then the cause
in one line: ``RuntimeError: a bug in the input pipeline``), the moment
it decides to end with a non-zero code: csrun's own aborts (a streamer's failed input pipeline,
the chief's end of a failed job) and, under mpi4py's runner (``python -m mpi4py``, as python-pt
starts a script in a job), an uncaught exception, ``sys.exit(N)`` or Ctrl-C
(:func:`install_last_word`). ``MPI_Abort`` follows, on which mpiexec kills every wrapper at once,
the aborting task's own included, so that its report would never be written.

A planned stop is not a failure: a run that was asked to stop (a preemption signal, SIGTERM,
Ctrl-C at the launcher) and saved its checkpoint ends with ``128 + signal`` all the same, and
says beforehand that this code is its plan (:func:`planned_stop`): ``stop.<rank>``, in the
format of a report, its cause the run's own line (``stopped by SIGTERM at global step 57``).
Then mpi4py's runner does not turn the code into ``MPI_Abort`` (whose ``Abort(143) on node 0``
and killed peers read as a crash), the task's wrapper tells mpiexec or srun 0 (no ``BAD
TERMINATION`` banner, no ``srun: error``) while its report keeps the code, and the launcher
names nobody: the job's code is the stop's.

The first failure decides the job's exit code, so "first" must not depend on which process
happened to write a file sooner. A task's command ends first; its wrapper reports a moment
later, and meanwhile another task, which saw its peer go (MPI's lost connection), may end with
a consequential error, or ``mpiexec`` may kill every wrapper, so that the first task's report is
never written (a wrapper killed with ``kill -9`` writes none either). File times do not settle it
(a tmpfs stamps with a jiffy's granularity). So the launcher watches the commands' processes
itself wherever it can see them (same host and PID namespace: local mode, and tasks that
Slurm places on the launcher's node): :class:`TaskWatch` holds pidfds of each command and its
wrapper and notes the moment the first of the two ends (a process that held much memory takes
a while to end, a killed wrapper's command more so). The first failure is then the earliest-ending task whose code is not 0:
its last word's code, else its report's, or 137 ("killed") when its wrapper ended without either
(:data:`SETTLE_S` after the wrapper's end: a wrapper still copying its command's last lines has
not reported yet); a task's end is the earliest of its last word, its report and the moment the
launcher saw it end. Tasks
on other nodes count by their report's time. Ends seen in one wake-up of the launcher share a
moment; among them a task that reported goes first (mpiexec, once a task failed, kills the
other tasks' wrappers: those end without a report), then the lower rank. A planned stop counts
from the moment it was announced, and what ends after it is its consequence: the earliest end
with a non-zero code that is a planned stop means that nothing failed (:meth:`TaskWatch.first_end`).
"""

from __future__ import annotations

import math
import os
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from csrun.env_settings import JOB_STATE
from csrun.files import atomic_write

SETTLE_S = 0.5
"""How long a watched task's report may lag its end before it counts as killed without one."""
CAUSE_MAX = 300
"""Characters of a task's stated cause kept for the launcher's line."""
KILLED = 137
"""The code of a task that ended without a report (its wrapper was killed; its command got SIGKILL)."""


@dataclass(frozen=True)
class TaskExit:
    """A task's end: its rank, node, exit code, when it ended (epoch seconds), and whether it
    reported (False: the launcher saw it end and no report came)."""

    rank: int
    node: str
    code: int
    at: float = 0.0
    reported: bool = True
    cause: str = ""
    """What the task said it ended for (its last word's one line: an exception's type and message)."""
    planned: bool = False
    """The code is a stop the task announced (:func:`planned_stop`), not a failure."""


def pid_namespace() -> str:
    """This process's PID namespace (``/proc/self/ns/pid``'s link; ``?`` where it cannot be read)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "?"


def report_start(state_dir: str, rank: int, node: str, pid: int) -> None:
    """Write ``start.<rank>`` (the command's pid as this node sees it); errors are ignored."""
    line = f"{pid} {os.getpid()} {pid_namespace()} {socket.gethostname()} {node}\n"
    try:
        atomic_write(Path(state_dir) / f"start.{rank}", line, durable=False)
    except OSError:
        pass


def one_line(text: str) -> str:
    """``text`` as one printable line of at most :data:`CAUSE_MAX` characters."""
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return line if len(line) <= CAUSE_MAX else line[:CAUSE_MAX - 3] + "..."


def report_exit(state_dir: str, rank: int, node: str, code: int, *, kind: str = "exit", cause: str = "") -> None:
    """Write ``<kind>.<rank>`` (``<code> <node> <time> [cause]``) atomically into ``state_dir``;
    errors are ignored (the job then ends by MPI's or Slurm's own means)."""
    try:
        atomic_write(Path(state_dir) / f"{kind}.{rank}", f"{code} {node} {time.time():.6f} {one_line(cause)}".rstrip()
                     + "\n", durable=False)
    except OSError:
        pass


def read_exits(state_dir: str, kind: str = "exit") -> dict[int, TaskExit]:
    """The reports (``kind`` "exit") or last words ("last") in ``state_dir`` by rank."""
    found: dict[int, TaskExit] = {}
    for path in Path(state_dir).glob(f"{kind}.*"):
        try:
            code_text, node, at_text, cause = (path.read_text().strip().split(None, 3) + ["", "", ""])[:4]
            rank = int(path.name.split(".", 1)[1])
            at = float(at_text) if at_text else path.stat().st_mtime
            found[rank] = TaskExit(rank, one_line(node), int(code_text), at, cause=one_line(cause))
        except (OSError, ValueError):
            continue
    return found


def last_word(code: int, rank: int, node: str, cause: str = "") -> None:
    """In a task of a csrun_wse job (``CSRUN_JOB_STATE`` set): write ``last.<rank>``, this task's
    own word that it is ending with ``code`` (and why, in one line), before an ``MPI_Abort`` that
    may kill its wrapper first. Elsewhere, or for code 0, nothing."""
    state = os.environ.get(JOB_STATE.name, "")
    if state and code and not (Path(state) / f"last.{rank}").exists():  # the first word stands (its time, its cause)
        report_exit(state, rank, node, code, kind="last", cause=cause)


_planned: int | None = None
"""The exit code this process announced as its planned stop (:func:`planned_stop`)."""


def planned_stop(code: int, rank: int, node: str, cause: str = "") -> None:
    """This task is about to exit with ``code`` as planned (a run asked to stop that saved its
    checkpoint; ``cause``: its one line). In a task of a csrun_wse job, write ``stop.<rank>`` for
    the launcher and the task's wrapper; and under mpi4py's runner, exit with ``code`` without
    ``MPI_Abort`` (module docstring)."""
    global _planned
    _planned = code
    state = os.environ.get(JOB_STATE.name, "")
    if state:
        report_exit(state, rank, node, code, kind="stop", cause=cause)


def planned_code(state_dir: str, rank: int) -> int | None:
    """The exit code task ``rank`` announced as its planned stop, if it did."""
    found = read_exits(state_dir, "stop").get(rank)
    return found.code if found is not None else None


def describe(error: BaseException | None) -> str:
    """``Type: last line of the message`` of an exception ending a task (``""`` for none)."""
    if error is None or isinstance(error, (SystemExit, KeyboardInterrupt)):
        return "interrupted (Ctrl-C)" if isinstance(error, KeyboardInterrupt) else ""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[-1]}" if lines else type(error).__name__


def install_last_word(rank: int, node: str) -> None:
    """Under mpi4py's runner (``python -m mpi4py``): call :func:`last_word` with the status the
    runner is about to abort with (a wrapper around ``mpi4py.run.set_abort_status``, which the
    runner calls before re-raising an uncaught exception, ``SystemExit`` or Ctrl-C); an exit
    with this task's planned stop's code (:func:`planned_stop`) is left a plain exit, no last word
    and no ``MPI_Abort`` (the run stopped all it had started). Elsewhere nothing changes."""
    runner = sys.modules.get("mpi4py.run")
    original = getattr(runner, "set_abort_status", None)
    if not os.environ.get(JOB_STATE.name) or original is None or getattr(original, "__csrun_last_word__", False):
        return

    def set_abort_status(status: object) -> None:
        code = status.code if isinstance(status, SystemExit) else status
        code = 128 + signal.SIGINT if isinstance(status, KeyboardInterrupt) else code
        if _planned is not None and code == _planned and not isinstance(status, KeyboardInterrupt):
            return  # a planned stop: the process exits with its code after MPI_Finalize, as at a clean end
        last_word(code if isinstance(code, int) else (0 if code is None else 1), rank, node,
                  describe(sys.exc_info()[1]))  # the runner calls this inside its ``except``
        original(status)

    set_abort_status.__csrun_last_word__ = True  # type: ignore[attr-defined]
    setattr(runner, "set_abort_status", set_abort_status)


class TaskWatch:
    """Pidfds of the tasks' commands (and wrappers) on this host in this PID namespace; notes when each task ends."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.ended: dict[int, float] = {}
        """rank -> epoch seconds at which its command (or its wrapper, if first) was seen to end."""
        self.wrapper_ended: dict[int, float] = {}
        """rank -> when its wrapper was seen to end (the report comes before that, unless it was killed)."""
        self.nodes: dict[int, str] = {}
        self._seen: set[int] = set()
        self._selector = selectors.DefaultSelector()
        self._here = (pid_namespace(), socket.gethostname())
        self._signal: int | None = None

    def _adopt(self) -> None:
        if not hasattr(os, "pidfd_open"):
            return
        for path in Path(self.state_dir).glob("start.*"):
            try:
                rank = int(path.name.split(".", 1)[1])
                if rank in self._seen:
                    continue
                pid_text, wrapper_text, namespace, host, node = path.read_text().split()
                pids = (int(pid_text), int(wrapper_text))
            except (OSError, ValueError):
                continue
            self._seen.add(rank)
            self.nodes[rank] = one_line(node)
            if (namespace, host) != self._here:
                continue  # another node or container: its report is all there is
            for pid, which in zip(pids, ("command", "wrapper")):
                try:
                    fd = os.pidfd_open(pid)
                except OSError:  # ended already, before it was watched: its report tells
                    continue
                self._selector.register(fd, selectors.EVENT_READ, (rank, which))
                if which == "command" and self._signal is not None:
                    _send(fd, self._signal)

    def signal_commands(self, sig: int) -> None:
        """Send ``sig`` to every watched task's command, and to each command that starts from now
        on (a task of this job starting late gets it as it is seen)."""
        for key in list(self._selector.get_map().values()):
            if key.data[1] == "command":
                _send(key.fd, sig)  # type: ignore[arg-type]
        self._signal = sig
        self._adopt()  # those that started meanwhile

    def wait(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking at once when a watched command ends."""
        self._adopt()
        if not self._selector.get_map():
            time.sleep(timeout)
            return
        ready = self._selector.select(timeout)
        now = time.time()  # one moment for every end seen in one wake-up: their order is not known
        for key, _ in ready:
            rank, which = key.data
            self.ended.setdefault(rank, now)
            if which == "wrapper":
                self.wrapper_ended.setdefault(rank, now)
            self._selector.unregister(key.fd)
            os.close(key.fd)  # type: ignore[arg-type]

    def close(self) -> None:
        """Close the pidfds still open."""
        for key in list(self._selector.get_map().values()):
            os.close(key.fd)  # type: ignore[arg-type]
        self._selector.close()

    def first_failure(self, *, final: bool = False) -> TaskExit | None:
        """The earliest-ending task whose code is not 0 (module docstring), or None: none yet, or a
        planned stop came first (:meth:`first_end`)."""
        end = self.first_end(final=final)
        return end if end is not None and not end.planned else None

    def first_end(self, *, final: bool = False) -> TaskExit | None:
        """The earliest-ending task whose code is not 0, a failure or a planned stop (``planned``;
        module docstring), or None. Until ``final`` (the step has ended), a watched task whose command
        ended and whose wrapper has not reported (nor ended :data:`SETTLE_S` ago) keeps the answer
        open (None)."""
        reports = read_exits(self.state_dir)
        last_words = read_exits(self.state_dir, "last")
        stops = read_exits(self.state_dir, "stop")
        ends: list[TaskExit] = []
        for rank in set(reports) | set(last_words) | set(self.ended) | set(stops):
            said = last_words.get(rank) or reports.get(rank)
            stop = stops.get(rank)
            planned = stop if stop is not None and (said is None or said.code == stop.code) else None
            times = [e.at for e in (last_words.get(rank), reports.get(rank), planned) if e is not None]
            at = min(times + ([self.ended[rank]] if rank in self.ended else []))
            wrapper_gone = self.wrapper_ended.get(rank)  # a wrapper that ended without a report was killed
            if planned is not None:
                ends.append(TaskExit(rank, planned.node, planned.code, at, cause=planned.cause, planned=True))
            elif said is not None:
                ends.append(TaskExit(rank, said.node, said.code, at, cause=said.cause))
            elif final or (wrapper_gone is not None and time.time() - wrapper_gone >= SETTLE_S):
                ends.append(TaskExit(rank, self.nodes.get(rank, "?"), KILLED, at, reported=False))
            else:
                ends.append(TaskExit(rank, self.nodes.get(rank, "?"), -1, at, reported=False))  # not known yet
        for end in sorted(ends, key=lambda e: (e.at, not e.reported, e.rank)):
            if end.code == -1:
                return None  # the earliest end's code is not in yet
            if end.code != 0:
                return end
        return None


def _send(pidfd: int, sig: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except OSError:  # it has ended meanwhile
        pass


@dataclass(frozen=True)
class ProgressNote:
    """The chief's last progress report: global step of total, loss, samples/s and seconds left."""

    step: int
    total: int
    loss: float
    rate: float
    eta: float


def report_progress(note: ProgressNote) -> None:
    """In a csrun_wse job, rewrite the state folder's ``progress`` file; elsewhere nothing."""
    state = os.environ.get(JOB_STATE.name, "")
    if state:
        try:
            atomic_write(Path(state) / "progress", f"{note.step} {note.total} {note.loss!r} {note.rate!r} {note.eta!r}\n",
                         durable=False)
        except OSError:
            pass


def read_progress(state_dir: str) -> ProgressNote | None:
    """The ``progress`` file of ``state_dir`` (None: none yet, or not five numbers)."""
    try:
        step, total, loss, rate, eta = (Path(state_dir) / "progress").read_text().split()
        note = ProgressNote(int(step), int(total), float(loss), float(rate), float(eta))
    except (OSError, ValueError):
        return None
    if not (0 <= note.step <= note.total and math.isfinite(note.rate) and math.isfinite(note.eta) and note.eta >= 0):
        return None  # what a person reads is numbers that make sense (a NaN loss is shown as it is)
    return note


def main(argv: list[str] | None = None) -> int:
    """``python -m csrun.task_exits STATE_DIR``: the first failure of an ended job's state folder,
    as ``code<TAB>rank<TAB>node<TAB>cause``, or a planned stop that came first as its code alone
    (nothing when no task failed or stopped); for a batch script."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m csrun.task_exits STATE_DIR", file=sys.stderr)
        return 2
    watch = TaskWatch(args[0])
    try:
        found = watch.first_end(final=True)
    finally:
        watch.close()
    if found is not None and found.planned:
        print(found.code)
    elif found is not None:
        print("\t".join((str(found.code), str(found.rank), found.node or "?", found.cause)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
