"""csrun_cpu — run a command on one whole CPU node: the validation and compile path.

Usage::

    csrun_cpu [options] COMMAND [ARGS...]
    csrun_cpu python-pt run.py --mode train --params configs/fc_mnist.yaml --compile_only

Builds and runs ``srun --job-name=csrun_cpu:<script> [--pty] --nodes=1 --ntasks=1 --exclusive
--cpus-per-task=C [--exclude=GRES_NODE] COMMAND``, printing ``Running: <line>`` first
(``<script>``: the command's first ``.py`` argument, else its program's name; ``squeue`` shows
it). ``--pty`` is added only when stdin and stdout are a terminal. Parsing stops at the first word that is not an option; the rest is
the command. Options take ``--opt val`` or ``--opt=val``, with dashes or underscores.

Options:

``--alloc-node True/False`` (default True)
    True: run through srun on one whole node. False: run the command right here, no srun.
``--mount-dirs a,b``
    Extra paths to bind into the container, added to the site's (passed to python-pt
    through ``CSRUN_MOUNT_DIRS``).
``--legacy-imports``
    Run an R1.x script with no edit at all: for this job only, ``import cerebras.framework.torch
    as cbtorch`` and ``import cerebras.framework.torch.core.cb_model as cm`` resolve to
    :mod:`csrun.torch` and :mod:`csrun.torch.core.cb_model` (a shim folder inside csrun goes
    first on every task's ``PYTHONPATH``, with ``CSRUN_LEGACY_IMPORTS=1``; nothing named
    ``cerebras`` is installed). In a container the image's csrun must sit at the same path.
``--logging True/False`` (default True)
    Echo the ``Running: ...`` line.
``--exclude_gres True/False`` (default True)
    Keep the job off the node that owns the system's GRES (``--exclude=GRES_NODE``).
``--dry-run``
    Print the line that would run and exit 0.
``--use-sbatch``
    Submit the command as a batch job through submitit instead (one exclusive node, named
    ``csrun_cpu:<script>``); prints ``Submitted batch job ID; logs in <log-dir>/ID`` and the
    commands that follow the job from its id alone, ``csrun status ID`` and ``csrun logs ID
    [--follow]`` (see :mod:`csrun.cli.csrun_main`), and returns at once.
``--wait``
    With ``--use-sbatch``: stream the job's log (``ID_0_log.out`` onto stdout, ``ID_0_log.err``
    onto stderr) as it grows until the job ends, then print ``csrun_cpu: job ID STATE, exit
    code N`` (N: the command's own exit code) and exit with it (1 for a job that ended
    otherwise than COMPLETED with code 0: cancelled, timed out). Ctrl-C stops the waiting
    (exit 130), not the job.
``--log-dir DIR``
    The command's output also goes to ``DIR/<job>-0.log`` (``<job>``: the Slurm job id, or
    ``local-<pid>``), through the task wrapper (:mod:`csrun.launch.task_log`); the console
    keeps it too. With ``--use-sbatch`` the job's logs go to ``DIR/<job id>/`` (``csrun_logs``
    when not given).
``--job-name NAME``
    The name of the srun job or of the ``--use-sbatch`` job, instead of ``csrun_cpu:<script>``.
``--time LIMIT``
    With ``--use-sbatch``: time limit (none by default).
``--def_nodes``, ``--def_tasks``, ``--def_cpus``, ``--singularity``, ``--def_mount_dirs``, ``--def_gres``, ``--def_gres_node``
    Print that site setting and exit.
``--version``
    Print ``csrun_cpu (csrun X.Y.Z)`` and exit 0 (the first word only).
``-h``, ``--help``
    Show the options with their defaults.

No Slurm (no ``srun`` on PATH, or no controller answering): says so in one line and runs the
command here as a plain subprocess, with the same environment.

Environment read: the site config (``CSRUN_SITE_CONFIG`` and ``CSRUN_*`` overrides, see
:mod:`csrun.site`), ``CSRUN_SLURM_PROBE_TIMEOUT``. Environment set for the command: the
contract in :mod:`csrun.launch.environment` (``CSRUN_LAUNCHER=csrun_cpu``,
``CSRUN_LAUNCH_MODE``, ``CSRUN_TOTAL_TASKS``, ``CSRUN_TOTAL_NODES`` and the site's
``CSRUN_*``; with ``--log-dir`` ``CSRUN_TASK_LOG_DIR`` and, off Slurm, ``CSRUN_JOB_LABEL``);
``CS_IP`` passes through.

Exit codes: the command's; 2 for a bad option, value or site config; 1 when the launch fails.
"""

from __future__ import annotations

import os
import sys

from csrun.cli.variables import misspelt
from csrun.env_settings import check_environment
from csrun.cli.common import console_entry, run_cli, say, show_and_run, shown
from csrun.errors import LaunchError, UsageError
from csrun.launch import sbatch
from csrun.launch.environment import legacy_imports_environment, task_environment
from csrun.launch.jobs import follow_hint, wait_and_report
from csrun.launch.options import SBATCH_LOG_DIR, SITE_QUERIES, CpuOptions, help_text, parse_args
from csrun.launch.slurm_probe import probe_slurm
from csrun.launch.srun import cpu_srun_argv, job_name
from csrun.launch.supervisor import task_command
from csrun.launch.task_log import task_log_environment
from csrun.site import load_site_config

PROG = "csrun_cpu"


def _body(argv: list[str]) -> int:
    parsed = parse_args(argv, CpuOptions, PROG)
    if parsed.help:
        say(help_text(PROG, CpuOptions, "Run a command on one whole CPU node (the validation and compile path)."))
        return 0
    check_environment()
    for warning in misspelt(os.environ):
        print(f"{PROG}: warning: {warning}", file=sys.stderr, flush=True)
    site = load_site_config()
    if parsed.query:
        say(SITE_QUERIES[parsed.query](site))
        return 0
    opts: CpuOptions = parsed.options
    if not parsed.command:
        raise UsageError(f"no command given. Example: {PROG} python-pt run.py --mode train --params configs/fc_mnist.yaml")
    if opts.wait and not opts.use_sbatch:
        raise UsageError("--wait only goes with --use-sbatch")

    use_slurm = opts.alloc_node or opts.use_sbatch
    if use_slurm and not opts.dry_run:
        status = probe_slurm()
        if not status.available:
            if opts.use_sbatch:
                raise LaunchError(f"--use-sbatch needs Slurm, and there is none here: {status.reason}")
            say(f"{PROG}: no Slurm here ({status.reason}); running the command locally.")
            use_slurm = False
    env = task_environment(
        launcher=PROG, mode="slurm" if use_slurm else "local", site=site,
        extra_mounts=opts.mount_dirs, total_tasks=1, total_nodes=1,
    )
    if opts.legacy_imports:
        env.update(legacy_imports_environment(env))
    command = list(parsed.command)
    name = job_name(PROG, command, opts.job_name)
    if opts.log_dir and not opts.dry_run:
        env.update(task_log_environment(opts.log_dir, slurm=use_slurm))
        command = task_command(command)

    if opts.use_sbatch:
        if opts.dry_run:
            say(f"Submitting: {shown(command)} (sbatch via submitit, one exclusive node, job name {name})")
            return 0
        sub = sbatch.submit(
            command, env, site, job_name=name, log_dir=opts.log_dir or SBATCH_LOG_DIR,
            time=opts.time, exclude_gres=opts.exclude_gres,
        )
        say(f"Submitted batch job {sub.job_id}; logs in {sub.log_folder}")
        if not opts.wait:
            say(follow_hint(sub.job_id))
            return 0
        return wait_and_report(PROG, sub.job_id, say)

    if use_slurm:
        pty = sys.stdin.isatty() and sys.stdout.isatty()
        line = cpu_srun_argv(command, site, exclude_gres=opts.exclude_gres, pty=pty, name=name)
    else:
        line = command
    return show_and_run("Running", line, env, echo=opts.logging, dry_run=opts.dry_run)


def main(argv: list[str] | None = None) -> int:
    """csrun_cpu's entry point; returns the exit code."""
    return run_cli(PROG, _body, argv)


console_main = console_entry(main)


if __name__ == "__main__":
    console_main()
