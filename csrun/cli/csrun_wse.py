"""csrun_wse — launch a job on the system: one chief task and streamer tasks on worker nodes.

Usage::

    csrun_wse [options] COMMAND [ARGS...]
    csrun_wse --total-nodes 3 --tasks-per-node 2 python-pt run.py --mode train --params P --cs_ip H:9000

Prints ``Launching: <line>`` and runs one ``srun --unbuffered --kill-on-bad-exit --quit-on-interrupt --mpi=pmi2
--job-name=csrun_wse:<script>`` step (``<script>``: the command's first ``.py`` argument, else its
program's name; ``squeue`` shows it), so every task is in one MPI world and rank 0 (the chief)
sits on the node holding the system's GRES:

* 1 node: ``--exclusive --nodes=1 --tasks-per-node=T --cpus-per-task=C --gres=GRES COMMAND``;
* N > 1: a heterogeneous step, ``:`` between components: the chief's node
  (``--nodes=1 --tasks-per-node=T --gres=GRES``), then the workers
  (``--nodes=N-1 --tasks-per-node=T [--distribution=cyclic] --exclusive --exclude=GRES_NODE``);
* N > 1 with ``--single-task-nodes S``: S one-task components of one node (the first holds
  the GRES), then ``--nodes=N-S --tasks-per-node=T``. 5 nodes, S=2, T=4: 14 tasks.

A Wafer-Scale Cluster, ``--num-csx C`` with C > 1: C emulated systems train one model data
parallel (each runs the compiled step on its share of the batch), **MemoryX** holds the weights
and optimizer state and applies the update to their summed gradients, and SwarmX's collectives
(MPI, in the job's one MPI world) carry weights out and gradients back
(:mod:`csrun.emulator.swarm`). The step is always heterogeneous, its components giving the ranks
(:mod:`csrun.cluster`, :func:`csrun.launch.layout.cluster_layout`):

* rank 0, the chief (runs COMMAND): ``--nodes=1 --tasks-per-node=1 --gres=GRES
  [--exclude=SYSTEM_NODES]``;
* ranks 1..C, the systems: ``--nodes=C --tasks-per-node=1 --gres=GRES --exclusive
  --exclude=GRES_NODE`` (one node and one GRES each);
* rank C+1, MemoryX: ``--nodes=1 --tasks-per-node=1 --exclusive --exclude=GRES_NODE[,SYSTEM_NODES]``;
* ranks C+2.., the streamers (run COMMAND): the other ``N-C-2`` nodes, ``--tasks-per-node=T``
  (``--cyclic``, ``--single-task-nodes S``: S-1 one-task streamer nodes first, the chief being the
  first one-task node), exclusive and off the same nodes as MemoryX.

``N`` (``--total-nodes``, default the site's ``def_nodes`` but at least C+3) counts them all, so it
must be at least C+3 (the chief, C systems, MemoryX, one streamer node). ``SYSTEM_NODES`` is the
site's ``system_nodes`` (left out when empty). The system and MemoryX tasks run
``python -m csrun.emulator.swarm.task`` instead of COMMAND (the task wrapper does it,
:mod:`csrun.launch.task`); with ``--emulator DEVICE`` no cs_emulator is started: the systems run
their engines on DEVICE (``CSRUN_SYSTEM_DEVICE``). Every task gets ``CSRUN_NUM_CSX=C``.
``--use-sbatch`` submits the same components; without Slurm the same tasks, in the same order,
run here under mpiexec. ``--num-csx 1`` (the default) is the one-system job above, unchanged.

Options (``--opt val`` or ``--opt=val``, dashes or underscores; parsing stops at the first
word that is not an option):

``--total-nodes N``
    Nodes for the job (default: the site's ``def_nodes``).
``--tasks-per-node T``, ``--cpus-per-task C``
    Defaults from the site; when only one is given the other is worked out from the node's
    CPU count (``sinfo``, or this machine's without Slurm).
``--single-task-nodes S`` (default 0)
    How many nodes run exactly one task; must be less than the number of nodes.
``--num-csx C`` (default 1)
    A Wafer-Scale Cluster of C systems (above); C > 1 needs ``--total-nodes`` >= C+3. A bad
    value (not a whole number >= 1) is a usage error (exit 2).
``--cyclic``
    ``--distribution=cyclic`` for the worker component (default block).
``--emulator [DEVICE]``
    Start a ``cs_emulator`` for this job on the chief's node (``DEVICE``: ``cpu`` (default),
    ``cuda``, ``cuda:I``), with a token generated for the job (``CSRUN_EMULATOR_TOKEN`` in
    every task's environment) and ``CS_IP`` pointing the chief at it; it is stopped when the
    job ends, whatever the exit. Every task runs under ``python -m csrun.launch.job_emulator``
    (see there). With ``--num-csx C`` > 1: no cs_emulator; ``CSRUN_SYSTEM_DEVICE=DEVICE`` for the
    systems' engines (without ``--emulator`` they run on cpu) and ``CS_IP`` is not passed on.
``--mount-dirs a,b``
    Extra container binds, added to the site's (passed on as ``CSRUN_MOUNT_DIRS``).
``--legacy-imports``
    Run an R1.x script with no edit at all: for this job only, ``import cerebras.framework.torch
    as cbtorch`` and ``import cerebras.framework.torch.core.cb_model as cm`` resolve to
    :mod:`csrun.torch` and :mod:`csrun.torch.core.cb_model` (a shim folder inside csrun goes
    first on every task's ``PYTHONPATH``, with ``CSRUN_LEGACY_IMPORTS=1``; nothing named
    ``cerebras`` is installed). In a container the image's csrun must sit at the same path.
``--logging True/False`` (default True)
    Echo the ``Launching: ...`` line.
``--dry-run``
    Print the line and exit 0.
``--use-sbatch``
    Submit the same layout as a heterogeneous batch job (one ``#SBATCH`` block per
    component, ``#SBATCH hetjob`` between them, named ``csrun_wse:<script>``) whose body runs
    the step; prints ``Submitted batch job ID; logs in <log-dir>/ID`` (the folder also keeps
    the script as ``job.sbatch``) and the commands that follow the job from its id alone:
    ``csrun status ID`` (state, exit code, nodes, log folder, elapsed time) and ``csrun logs ID
    [--follow]`` (the chief's log; see :mod:`csrun.cli.csrun_main`). With ``--dry-run`` prints
    the script.
``--wait``
    With ``--use-sbatch``: stream the job's log (``ID_log.out`` onto stdout, ``ID_log.err`` onto
    stderr: the chief's console) as it grows until the job ends, then print
    ``csrun_wse: job ID STATE, exit code N`` (STATE: Slurm's, COMPLETED, FAILED, CANCELLED,
    TIMEOUT...) and exit with that code (1 for a job that ended otherwise than COMPLETED with
    code 0). Ctrl-C stops the waiting (exit 130), not the job.
``--log-dir DIR``
    One log file per task, ``DIR/<job>-<rank>.log`` (``<job>``: the Slurm job id, or
    ``local-<pid>`` under mpiexec): every task's stdout and stderr go into its own file, the
    console keeps the chief's (rank 0), and a failed task's line names its file (see
    :mod:`csrun.launch.task_log`). With ``--use-sbatch`` the job's own logs go to
    ``DIR/<job id>/`` (``csrun_logs`` when not given; per-task files only when given).
``--job-name NAME``
    The name of the srun step or of the ``--use-sbatch`` job, instead of ``csrun_wse:<script>``.
``--time LIMIT``
    With ``--use-sbatch``: time limit (none by default).
``--preempt-lead SECONDS`` (default 90)
    With ``--use-sbatch``: the job asks for SIGUSR1 that long before its time limit
    (``--signal=B:USR1@SECONDS``, ``--requeue``); the runner then checkpoints and stops, the
    job requeues itself and the next run resumes (see :mod:`csrun.launch.hetjob`). 0: never.
``--def_nodes`` … ``--def_gres_node``
    Print that site setting and exit (as csrun_cpu).
``--version``
    Print ``csrun_wse (csrun X.Y.Z)`` and exit 0 (the first word only).
``-h``, ``--help``
    Show the options with their defaults.

No Slurm (no ``srun`` on PATH, or no controller answering): says so in one line and runs every
task of the layout (a cluster's too: chief, systems, MemoryX, streamers) here under ``mpiexec -n <tasks>`` (the one beside this Python, from the
mpich wheel, else the first on PATH), with the same environment contract.

Environment read: the site config (``CSRUN_SITE_CONFIG``, ``CSRUN_*``),
``CSRUN_SLURM_PROBE_TIMEOUT``. Environment set for every task: :mod:`csrun.launch.environment`
(``CSRUN_LAUNCHER=csrun_wse``, ``CSRUN_LAUNCH_MODE``, ``CSRUN_TOTAL_TASKS``,
``CSRUN_TOTAL_NODES``, the site's ``CSRUN_*``; with ``--num-csx C`` > 1 ``CSRUN_NUM_CSX`` and, with
``--emulator DEVICE``, ``CSRUN_SYSTEM_DEVICE`` (else both removed); with ``--log-dir`` ``CSRUN_TASK_LOG_DIR`` and,
under mpiexec, ``CSRUN_JOB_LABEL``); ``CS_IP`` passes through.

Every task runs under ``python -m csrun.launch.task`` (which reports how its command ended) and
the step is supervised (:mod:`csrun.launch.supervisor`): when any task exits non-zero — before
or after MPI init, in user code or in csrun's exit hooks — the whole job ends within seconds
with one line, ``csrun_wse: task rank R on NODE exited with code C; ending the job``; killing
csrun_wse (even with SIGKILL) takes mpiexec/srun, the tasks and the job's emulator along within
a second or two (what the job left on this node is removed at once); whatever the ending, the
job's leftover MPICH segments in /dev/shm are removed on this node.

Ctrl-C, SIGTERM, SIGHUP, SIGUSR1 or SIGUSR2 at csrun_wse, locally and under Slurm alike: the
first asks the job to stop (one line says so; the preemption signal goes to the step: a training
run.py saves a checkpoint at its next step first, while the streamers and a cluster's systems and
MemoryX wait for it; a script of your own without a handler for it stops at once); a Ctrl-C after
it stops the job at once, saving nothing more. Slurm's own signals to the tasks (``scancel``, a
preemption) save the same way. A stop that saved names no task and prints nothing that reads as a
failure; continue with ``--resume``.

Exit codes: the first failed task's own code, every time (the task that ended first with a
non-zero code: csrun.task_exits), else a preempted run's 128+signal, else the step's; 128+N
after signal N at csrun_wse (130 after Ctrl-C); 2 for a bad option, value or site config; 1 when
the launch fails.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from pathlib import Path

from csrun.cli.variables import misspelt
from csrun.env_settings import check_environment
from csrun.cli.common import console_entry, run_cli, say, shown
from csrun.errors import LaunchError, UsageError
from csrun.launch.environment import cluster_environment, legacy_imports_environment, task_environment
from csrun.launch.hetjob import hetjob_script, submit_hetjob
from csrun.launch.jobs import follow_hint, wait_and_report
from csrun.launch.layout import min_cluster_nodes, resolve_tasks_and_cpus, wse_layout
from csrun.launch.options import SBATCH_LOG_DIR, SITE_QUERIES, WseOptions, help_text, parse_args
from csrun.launch.slurm_probe import node_cpus, probe_slurm
from csrun.launch.srun import job_name, mpiexec_argv, wse_srun_argv
from csrun.launch.reaper import reap
from csrun.launch.supervisor import make_state_dir, supervise, task_command
from csrun.launch.task_log import task_log_environment
from csrun.site import load_site_config

PROG = "csrun_wse"


def find_mpiexec() -> str:
    """The mpiexec beside this Python (the mpich wheel's), else the first on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise LaunchError("no Slurm and no mpiexec: install the mpich wheel (pip install mpich) or run on a Slurm cluster")
    return found


def _body(argv: list[str]) -> int:
    parsed = parse_args(argv, WseOptions, PROG)
    if parsed.help:
        say(help_text(PROG, WseOptions, "Launch a job on the system: the chief on the GRES node, streamers on worker nodes."))
        return 0
    check_environment()
    for warning in misspelt(os.environ):
        print(f"{PROG}: warning: {warning}", file=sys.stderr, flush=True)
    site = load_site_config()
    if parsed.query:
        say(SITE_QUERIES[parsed.query](site))
        return 0
    opts: WseOptions = parsed.options
    if not parsed.command:
        raise UsageError(f"no command given. Example: {PROG} --total-nodes 3 python-pt run.py --mode train --params P")
    if opts.wait and not opts.use_sbatch:
        raise UsageError("--wait only goes with --use-sbatch")

    status = probe_slurm()
    use_slurm = status.available
    if opts.use_sbatch and not use_slurm:
        raise LaunchError(f"--use-sbatch needs Slurm, and there is none here: {status.reason}")
    cpus = (node_cpus(site.partition) if use_slurm else None) or os.cpu_count() or 1
    tasks, cpus_per_task = resolve_tasks_and_cpus(
        opts.tasks_per_node, opts.cpus_per_task, node_cpus=cpus,
        default_tasks=site.def_tasks_per_node, default_cpus=site.def_cpus_per_task,
    )
    cluster = opts.num_csx > 1
    default_nodes = max(site.def_nodes, min_cluster_nodes(opts.num_csx)) if cluster else site.def_nodes
    layout = wse_layout(
        nodes=opts.total_nodes or default_nodes, tasks_per_node=tasks, cpus_per_task=cpus_per_task,
        single_task_nodes=opts.single_task_nodes, cyclic=opts.cyclic, num_csx=opts.num_csx,
    )
    env = task_environment(
        launcher=PROG, mode="slurm" if use_slurm else "local", site=site, extra_mounts=opts.mount_dirs,
        total_tasks=layout.total_tasks, total_nodes=layout.total_nodes,
    )
    cluster_environment(env, num_csx=opts.num_csx, system_device=opts.emulator)
    if opts.legacy_imports:
        env.update(legacy_imports_environment(env))
    if opts.log_dir and not opts.dry_run:
        env.update(task_log_environment(opts.log_dir, slurm=use_slurm))
    command = list(parsed.command)
    name = job_name(PROG, command, opts.job_name)
    if opts.emulator and not cluster:  # a cluster's systems are its device (cluster_environment)
        env["CSRUN_EMULATOR_TOKEN"] = secrets.token_urlsafe(32)
        env.pop("CS_IP", None)
        command = [sys.executable, "-m", "csrun.launch.job_emulator", "--device", opts.emulator, "--", *command]
    if opts.use_sbatch:
        log_dir = Path(opts.log_dir or SBATCH_LOG_DIR).resolve()
        script = hetjob_script(command, layout, site, job_name=name, log_dir=log_dir, time=opts.time, cwd=os.getcwd(), preempt_lead=opts.preempt_lead)
        if opts.dry_run:
            say(script)
            return 0
        sub = submit_hetjob(script, env, log_dir)
        say(f"Submitted batch job {sub.job_id}; logs in {sub.log_folder}")
        if not opts.wait:
            say(follow_hint(sub.job_id))
            return 0
        return wait_and_report(PROG, sub.job_id, say)
    if use_slurm:
        line = wse_srun_argv(task_command(command), layout, site, name=name)
    else:
        say(f"{PROG}: no Slurm here ({status.reason}); running the {layout.total_tasks} tasks locally under mpiexec.")
        line = mpiexec_argv(find_mpiexec(), task_command(command), layout)
    if opts.logging or opts.dry_run:
        say(f"Launching: {shown(line)}")
    if opts.dry_run:
        return 0
    try:
        reap()  # what a killed launcher left here (csrun.launch.reaper)
        return supervise(line, env, make_state_dir(shared=use_slurm), PROG)
    except FileNotFoundError:
        raise LaunchError(f"command not found: {line[0]!r}") from None


def main(argv: list[str] | None = None) -> int:
    """csrun_wse's entry point; returns the exit code."""
    return run_cli(PROG, _body, argv)


console_main = console_entry(main)


if __name__ == "__main__":
    console_main()
