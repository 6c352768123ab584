"""How python-pt runs a Python command: inside the site's Apptainer/Singularity image, or here.

Pure decisions and argv building (:func:`container_plan`); :mod:`csrun.cli.python_pt` runs it.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from csrun.cluster import cluster_info
from csrun.site import SiteConfig

UNSET_FOR_CONTAINER = (
    "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "LD_LIBRARY_PATH", "LD_PRELOAD",
    "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "PKG_CONFIG_PATH",
)
"""Host variables that would point the container's Python and toolchain at host files (the legacy
script unset PYTHONPATH, LD_LIBRARY_PATH and a few toolchain variables the same way)."""

CONTAINER_PYTHON = "python3"
"""The Python inside the image (sif/csrun.def installs Python 3.11 as python3)."""


@dataclass(frozen=True, kw_only=True)
class ContainerPlan:
    """What python-pt will run, and the notices it prints first."""

    argv: list[str]
    unset: tuple[str, ...] = ()
    """Variables to remove from the environment before running argv."""
    notices: list[str] = field(default_factory=list)


def find_runtime(which: Callable[[str], str | None] = shutil.which) -> str | None:
    """``apptainer``, else ``singularity``, else None."""
    for name in ("apptainer", "singularity"):
        path = which(name)
        if path:
            return path
    return None


def gpus_visible(environ: Mapping[str, str], dev: Path = Path("/dev")) -> bool:
    """True when NVIDIA GPUs are visible to this task (device files, not hidden by CUDA_VISIBLE_DEVICES)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return False
    return any(dev.glob("nvidia[0-9]*"))


def abort_on_failure(args: list[str]) -> list[str]:
    """``-m mpi4py ARGS`` for a script, ``-m`` module or ``-c`` command, else ARGS unchanged.

    Under mpich, a rank that raises or exits non-zero after MPI_Init hangs in MPI_Finalize
    while the others wait for it, and the step never ends. mpi4py's runner turns an uncaught
    exception or a non-zero exit into ``MPI_Abort`` on COMM_WORLD, which ends the whole job.
    """
    if args and (args[0] in ("-m", "-c") or not args[0].startswith("-")):
        return ["-m", "mpi4py", *args]
    return list(args)


def container_plan(
    args: list[str],
    site: SiteConfig,
    environ: Mapping[str, str],
    *,
    runtime: str | None,
    gpus: bool,
    cwd: str,
    multi_task: bool = False,
) -> ContainerPlan:
    """The argv for ``python-pt ARGS``: ``RUNTIME exec [--nv] [--bind a,b] IMAGE python3 ARGS``, or this Python.

    ``multi_task``: the job has several tasks, so ARGS run under :func:`abort_on_failure`.
    """
    if multi_task:
        args = abort_on_failure(args)
    if not site.image or runtime is None:
        why = "no container image configured (site 'image' / CSRUN_IMAGE)" if not site.image else f"no apptainer or singularity on PATH for image {site.image}"
        return ContainerPlan(argv=[sys.executable, *args], notices=[f"python-pt: {why}; running {sys.executable}"])
    notices: list[str] = []
    binds = list(site.mount_dirs)
    if not binds or binds == [cwd]:
        notices.append(f"python-pt: warning: the only bind is the current directory ({cwd}); add data paths with --mount-dirs or the site's mount_dirs")
    unset = tuple(name for name in UNSET_FOR_CONTAINER if name in environ)
    if unset:
        notices.append(f"python-pt: unset {', '.join(unset)} for the container")
    argv = [runtime, "exec"]
    if gpus:
        argv.append("--nv")
    if binds:
        argv += ["--bind", ",".join(binds)]
    argv += [site.image, CONTAINER_PYTHON, *args]
    return ContainerPlan(argv=argv, unset=unset, notices=notices)


def plan_for_this_task(args: list[str], site: SiteConfig) -> ContainerPlan:
    """:func:`container_plan` for this process: runtime on PATH, GPUs in /dev, the current folder."""
    return container_plan(
        args, site, os.environ, runtime=find_runtime(), gpus=gpus_visible(os.environ), cwd=os.getcwd(),
        multi_task=cluster_info().num_tasks > 1,
    )
