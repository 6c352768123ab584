"""python-pt — the Python of the PyTorch container: run a Python command inside the site image.

Usage::

    python-pt run.py --mode train --params configs/fc_mnist.yaml
    csrun_wse --total-nodes 2 python-pt run.py ...

When the site config names an image (``image`` / ``CSRUN_IMAGE``) and ``apptainer`` (or
``singularity``) is on PATH, runs ``apptainer exec [--nv] [--bind a,b] IMAGE python3 ARGS``:
``--nv`` when NVIDIA GPUs are visible (``/dev/nvidia*``, unless ``CUDA_VISIBLE_DEVICES`` hides
them), ``--bind`` with the site's mount dirs plus the launcher's ``--mount-dirs`` (both arrive
as ``CSRUN_MOUNT_DIRS``). Before that it unsets host variables that would leak into the
container — ``PYTHONPATH``, ``PYTHONHOME``, ``PYTHONSTARTUP``, ``LD_LIBRARY_PATH``,
``LD_PRELOAD``, ``LIBRARY_PATH``, ``CPATH``, ``C_INCLUDE_PATH``, ``CPLUS_INCLUDE_PATH``,
``PKG_CONFIG_PATH`` — saying which, and warns when the only bind is the current directory.

``python-ws`` (:mod:`csrun.cli.python_ws`) is the same with the weight-streaming build.

Otherwise it runs ARGS with the current Python (``sys.executable``), environment untouched,
after one notice line saying why (no image configured, or no runtime found).

In a job of several tasks (see :mod:`csrun.cluster`) a script, ``-m`` module or ``-c``
command runs under ``python -m mpi4py``: an uncaught exception or non-zero exit on any rank
then aborts the whole MPI job (``MPI_Abort``) instead of leaving the others hanging.

Notices are printed by the chief task only (rank 0, see :mod:`csrun.cluster`) so a job of
many tasks prints them once. The command replaces this process (exec): its exit code and
signals are the command's.

Environment read: the site config (``CSRUN_SITE_CONFIG``, ``CSRUN_IMAGE``,
``CSRUN_MOUNT_DIRS``, …), ``CUDA_VISIBLE_DEVICES``, the rank variables of :mod:`csrun.cluster`.
Exit codes: the command's; 2 for a bad site config; 127 when the program cannot be started.
"""

from __future__ import annotations

from csrun.cli.common import console_entry, run_cli
from csrun.launch.container import PYTHON_PT, exec_plan, plan_for_this_task
from csrun.site import load_site_config

PROG = PYTHON_PT.prog


def _body(args: list[str]) -> int:
    return exec_plan(plan_for_this_task(args, load_site_config(), PYTHON_PT), PROG)


def main(argv: list[str] | None = None) -> int:
    """python-pt's entry point (execs the command; returns only on error)."""
    return run_cli(PROG, _body, argv)


console_main = console_entry(main)


if __name__ == "__main__":
    console_main()
