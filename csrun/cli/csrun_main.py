"""csrun — the umbrella command: ``csrun env``, ``csrun status``, ``csrun logs`` and ``csrun --version``.

Usage::

    csrun env [--json]              the environment report for bug reports (see csrun.cli.env_report)
    csrun status JOBID [--json]     a batch job's state, exit code, nodes, log folder, elapsed time
    csrun logs JOBID [--follow]     a batch job's log (the chief's console); --follow: until it ends
    csrun --version                 csrun's version

``csrun env`` prints csrun's and Python's versions; torch, numpy, mpi4py, mpich, h5py,
tensorboard, submitit, pyyaml and rich; the MPI library's version, ``mpiexec``, the netmod and
``FI_PROVIDER`` a Slurm launch uses; Slurm's version and whether a controller answers (within
``CSRUN_SLURM_PROBE_TIMEOUT`` seconds, default 5); the site config with its file and the
``CSRUN_*`` variables that override it; every ``CSRUN_*`` knob's value in effect (set or
default) and ``CS_IP``; what torch sees of CUDA; and the ``CSRUN_*`` variables that are set.
``--json`` prints the same data as one JSON object. Exit 0; a usage error exits 2 with one line.

``csrun status JOBID`` follows up a job that ``csrun_wse --use-sbatch`` or ``csrun_cpu
--use-sbatch`` submitted without ``--wait`` (any Slurm job id works): one ``field: value`` line
each for the job, its name (``csrun_wse:run.py``), its state (Slurm's: PENDING, RUNNING,
COMPLETED, FAILED, CANCELLED, TIMEOUT...), the exit code once it ended (a csrun_cpu job's: the
command's own), why it waits (while pending), its nodes, the time it has run, its restarts (a
requeued job) and its log folder. ``--json``: the same as one JSON object. Exit 0.

``csrun logs JOBID`` prints the job's log as it stands: its stdout file (the chief's console)
onto stdout, its stderr file onto stderr. ``--follow`` (``-f``) keeps printing what is added
until the job ends (waiting first while it is pending), then prints
``csrun: job ID STATE, exit code N`` and exits with the job's exit code (1 for a job that
ended otherwise than COMPLETED with code 0), as the launchers' ``--wait`` does. Ctrl-C stops
the following, not the job.

The job is found from its id alone (:mod:`csrun.launch.jobs`): ``scontrol show job`` gives
its state and the paths of its stdout and stderr files, which both launchers put in the job's
log folder ``<log-dir>/<id>/``; no Slurm accounting is needed. A job id Slurm does not know
(never was, or a finished job older than the cluster's ``MinJobAge``): one line, exit 1 (its
files stay in its log folder). A job without a log file (an interactive srun job): one line,
exit 1.
"""

from __future__ import annotations

import argparse
import json

import csrun
from csrun.cli.common import console_entry
from csrun.help_style import Parser
from csrun.launch.process import run_cli


def parser() -> argparse.ArgumentParser:
    """The command line of ``csrun``."""
    p = Parser("csrun", "csrun's umbrella command.", usage="[options] COMMAND [ARGS...]")
    p.add_argument("--version", action="version", version=f"csrun {csrun.__version__}", help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", prog="csrun")
    env = sub.add_parser("env", help="print the environment report (paste it into bug reports)",
                         description="Print the environment report (paste it into bug reports).")
    env.add_argument("--json", action="store_true", help="one JSON object instead of text")
    status = sub.add_parser("status", help="a batch job's state, exit code, nodes, log folder and elapsed time",
                            description="A Slurm job's state, exit code (once ended), nodes, log folder and elapsed time.",
                            usage="JOBID [--json]")
    status.add_argument("job_id", metavar="JOBID", help="the job id (as sbatch and the launchers print it)")
    status.add_argument("--json", action="store_true", help="one JSON object instead of text")
    logs = sub.add_parser("logs", help="a batch job's log (the chief's console); --follow: until the job ends",
                          description="Print a Slurm job's log: its stdout file onto stdout, its stderr file onto stderr.",
                          usage="JOBID [--follow]")
    logs.add_argument("job_id", metavar="JOBID", help="the job id (as sbatch and the launchers print it)")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep printing until the job ends, then its final state; exit with its exit code")
    return p


def _status(job_id: str, as_json: bool) -> int:
    from csrun.launch.jobs import job_status

    st = job_status(job_id)
    if as_json:
        print(json.dumps(st.as_dict(), indent=1))
        return 0
    rows = [("job", st.job_id), ("name", st.name), ("state", st.state)]
    if st.exit_code is not None:
        rows.append(("exit code", str(st.exit_code)))
    if st.reason:
        rows.append(("reason", st.reason))
    rows += [("nodes", st.nodes or ("(none)" if st.ended else "(none yet)")), ("elapsed", st.elapsed)]
    if st.restarts:
        rows.append(("restarts", str(st.restarts)))
    rows.append(("log folder", str(st.log_folder) if st.log_folder else "(none: an interactive job's output went to its launcher's console)"))
    width = max(len(k) for k, _ in rows) + 1
    print("\n".join(f"{k + ':':<{width}} {v}" for k, v in rows), flush=True)
    return 0


def _logs(job_id: str, follow: bool) -> int:
    import sys

    from csrun.errors import LaunchError
    from csrun.launch.jobs import LogTail, exit_code_of, final_line, follow_hint, job_status
    from csrun.launch.jobs import follow as follow_job

    st = job_status(job_id)
    stdout = st.stdout
    if stdout is None:
        raise LaunchError(f"job {st.job_id} has no log file (an interactive srun job: its output went to its launcher's console)")
    if follow:
        try:
            st = follow_job(st.job_id)
        except KeyboardInterrupt:
            print(f"csrun: stopped following job {st.job_id}; it goes on. {follow_hint(st.job_id)}", file=sys.stderr, flush=True)
            return 130
        print(final_line("csrun", st), flush=True)
        return exit_code_of(st)
    found = LogTail(stdout).pump(sys.stdout, final=True)
    if st.stderr is not None and st.stderr != stdout:
        found = LogTail(st.stderr).pump(sys.stderr, final=True) or found
    if not found and st.ended:
        print(f"csrun: job {st.job_id} {st.state}, but its log {stdout} is not there (moved or removed)", file=sys.stderr, flush=True)
    elif not found:
        waits = f" ({st.reason})" if st.reason else ""
        print(f"csrun: job {st.job_id} is {st.state}{waits}: no log yet at {stdout}", file=sys.stderr, flush=True)
    return 0


def _main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.command == "status":
        return _status(args.job_id, args.json)
    if args.command == "logs":
        return _logs(args.job_id, args.follow)
    if args.command != "env":
        parser().print_help()
        return 2
    from csrun.cli.env_report import build_report, render_text

    report = build_report()
    print(json.dumps(report, indent=1, sort_keys=False) if args.json else render_text(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``csrun``; returns the exit code."""
    return run_cli("csrun", _main, argv)


console_main = console_entry(main)


if __name__ == "__main__":
    console_main()
