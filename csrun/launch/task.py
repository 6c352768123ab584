"""Run one task of a csrun_wse job and report how it ended: ``python -m csrun.launch.task -- COMMAND``.

csrun_wse starts every task through this wrapper (users need not). It runs COMMAND as a child
(which dies with the wrapper, ``PR_SET_PDEATHSIG``; the PMI file descriptors stay open for MPI;
SIGINT/SIGTERM/SIGHUP/SIGUSR1/SIGUSR2 are passed on), and when COMMAND ends, however it ends,
writes ``exit.<rank>`` into the job's state folder: ``<exit code> <node> <time>``, the code being
COMMAND's own (128+N when a signal N ended it); when COMMAND starts it writes ``start.<rank>``
(COMMAND's pid, so that the launcher can see it end: :mod:`csrun.task_exits`). The launcher's supervisor
(:mod:`csrun.launch.supervisor`) watches that folder (and the processes) and ends the whole job
at the first failure, naming the rank, the node, the code and the task's stated cause
(:mod:`csrun.task_exits`). The wrapper's exit code is
COMMAND's, except after a planned stop (COMMAND announced its code beforehand,
:func:`csrun.task_exits.planned_stop`: a run that saved its checkpoint and stopped when asked):
then the report keeps the code and the wrapper exits 0, so that mpiexec and srun see a clean
end (no ``BAD TERMINATION`` banner, no ``srun: error`` line, no ``--kill-on-bad-exit``).

The wrapper watches its launcher where it can see it (the state folder's ``owner``, on this
host and in this PID namespace: :mod:`csrun.launch.owner`): the moment the launcher ends while
COMMAND still runs (a ``kill -9`` of csrun_wse, which left no one to end the job), COMMAND is
SIGKILLed, so that nothing of the job outlives its launcher (exit code 137).
With ``CSRUN_TASK_LOG_DIR`` set (``--log-dir``), COMMAND's output is copied into
the task's own log file and, on the chief only, onto the console (:mod:`csrun.launch.task_log`);
without it, a streamer's lines reach the console prefixed ``[rank N] ``.

A cluster's system and MemoryX tasks (``csrun_wse --num-csx N``: ranks 1..N+1, where
:attr:`csrun.cluster.ClusterInfo.in_swarm`) do not run COMMAND: the wrapper runs
``<this Python> -m csrun.emulator.swarm.task`` in its place (:func:`task_command_for`), with this
wrapper's own interpreter, so outside any container prefix COMMAND has (``python-pt`` ...,
``apptainer exec IMAGE ...``): the swarm task is csrun's, not the user's. It is started, logged and
reported exactly as COMMAND would be (``start.<rank>``, ``exit.<rank>``, the header line names what ran).
It starts with the stop signals (:data:`csrun.launch.process.PASSED_ON`) ignored: they are for
the chief, which saves its checkpoint from MemoryX's state and then tells the systems and MemoryX
to stop; Slurm signals every task of a step, and a system or MemoryX that died of the signal
would take the checkpoint with it.

Environment read: ``CSRUN_JOB_STATE`` (the state folder; without it nothing is written),
``CSRUN_TASK_LOG_DIR`` / ``CSRUN_JOB_LABEL`` (the per-task log files) and the rank variables
of :mod:`csrun.cluster` (``CSRUN_NUM_CSX`` among them). It imports neither torch nor MPI.
"""

from __future__ import annotations

import os
import select
import shlex
import sys

from csrun.env_settings import JOB_STATE
from csrun.cluster import ClusterInfo, cluster_info
from csrun.errors import UsageError
from csrun.launch.owner import read_owner
from csrun.launch.process import PASSED_ON, run_child, run_cli
from csrun.task_exits import planned_code, report_exit, report_start
from csrun.launch.task_log import task_log_for

PROG = "csrun_wse (task)"
STATE_ENV = JOB_STATE.name
"""The job's state folder, set by the launcher for every task."""
SWARM_TASK = "csrun.emulator.swarm.task"
"""The module a cluster's system and MemoryX tasks run instead of the user's command."""


def task_command_for(info: ClusterInfo, command: list[str]) -> list[str]:
    """What this task runs: ``command``, except on a cluster's system or MemoryX task
    (``info.in_swarm``), which runs the swarm task with this Python (module docstring)."""
    if info.in_swarm:
        return [sys.executable, "-m", SWARM_TASK]
    return list(command)


def _body(argv: list[str]) -> int:
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        raise UsageError("no command given after --")
    info = cluster_info()
    command = task_command_for(info, command)
    code = 1
    log = task_log_for(os.environ, info.rank)
    shown = shlex.join(command).replace("\n", "\\n")
    header = f"csrun task rank {info.rank} on {info.node_name}, attempt {info.restart_count}: {shown}"
    state = os.environ.get(STATE_ENV, "")

    def started(pid: int) -> None:
        if state:
            report_start(state, info.rank, info.node_name, pid)

    owner = read_owner(state) if state else None
    launcher = owner.open() if owner is not None else None
    try:
        code = run_child(command, dict(os.environ), keep_fds=True, parent_death=9, log=log, log_header=header,
                         started=started, label="" if info.is_chief else f"[rank {info.rank}] ",
                         ignored=PASSED_ON if info.in_swarm else (), until=launcher)
        if launcher is not None and owner is not None and info.is_chief and select.select([launcher], [], [], 0)[0]:
            print(f"{PROG}: the job's launcher (pid {owner.pid} on {owner.host}) has ended: its tasks end too",
                  file=sys.stderr, flush=True)
    except FileNotFoundError:
        print(f"{PROG}: error: command not found: {command[0]!r}", file=sys.stderr, flush=True)
        code = 127
    finally:
        if launcher is not None:
            os.close(launcher)
        if state:
            report_exit(state, info.rank, info.node_name, code)
    return 0 if code and state and planned_code(state, info.rank) == code else code


def main(argv: list[str] | None = None) -> int:
    """The wrapper's entry point; returns COMMAND's exit code."""
    return run_cli(PROG, _body, argv)


if __name__ == "__main__":
    sys.exit(main())
