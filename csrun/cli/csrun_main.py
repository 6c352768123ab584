"""csrun — the umbrella command: ``csrun env`` and ``csrun --version``.

Usage::

    csrun env [--json]     the environment report for bug reports (see csrun.cli.env_report)
    csrun --version        csrun's version

``csrun env`` prints csrun's and Python's versions; torch, numpy, mpi4py, mpich, h5py,
tensorboard, submitit, pyyaml and rich; the MPI library's version, ``mpiexec``, the netmod and
``FI_PROVIDER`` a Slurm launch uses; Slurm's version and whether a controller answers (within
``CSRUN_SLURM_PROBE_TIMEOUT`` seconds, default 5); the site config with its file and the
``CSRUN_*`` variables that override it; and what torch sees of CUDA. ``--json`` prints the
same data as one JSON object. Exit 0; a usage error exits 2 with one line.
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
    return p


def _main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
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
