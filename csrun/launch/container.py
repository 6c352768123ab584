"""How python-pt and python-ws run a Python command: inside the site's Apptainer/Singularity image, or here.

Pure decisions and argv building (:func:`container_plan`); :func:`exec_plan` runs a plan, for
:mod:`csrun.cli.python_pt` and :mod:`csrun.cli.python_ws`. The two commands are the two
:class:`PythonBuild` s of the legacy container: :data:`PYTHON_PT` (the site's ``image``) and
:data:`PYTHON_WS`, the weight-streaming build (the site's ``ws_image``, else ``image``), which
also sets ``CSRUN_EXECUTION_STRATEGY=weight_streaming`` for the command
(:mod:`csrun.program.execution`): in the environment it runs with and, in a container, as
``--env`` of the runtime too. Binds, ``--nv`` and the variables unset are the same for both.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from csrun.cluster import cluster_info
from csrun.task_exits import last_word
from csrun.program.execution import EXECUTION_STRATEGY_ENV, WEIGHT_STREAMING
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
class PythonBuild:
    """One of the container's Python commands: its name, its image key, what it sets for the command."""

    prog: str
    """The command's name (in notices and errors)."""
    image_keys: tuple[str, ...]
    """Site config keys naming its image, the first non-empty one wins."""
    setenv: tuple[tuple[str, str], ...] = ()
    """Variables set for the command (in the environment, and ``--env`` in a container)."""

    def image(self, site: SiteConfig) -> str:
        """The image this build runs in ('' for none)."""
        return next((getattr(site, key) for key in self.image_keys if getattr(site, key)), "")

    def image_setting(self) -> str:
        """How a notice names the image setting, e.g. ``site 'image' / CSRUN_IMAGE``."""
        return " or ".join(f"site '{key}' / CSRUN_{key.upper()}" for key in self.image_keys)


PYTHON_PT = PythonBuild(prog="python-pt", image_keys=("image",))
"""``python-pt``: the PyTorch build (pipelined unless the run says otherwise)."""
PYTHON_WS = PythonBuild(prog="python-ws", image_keys=("ws_image", "image"),
                        setenv=((EXECUTION_STRATEGY_ENV, WEIGHT_STREAMING),))
"""``python-ws``: the weight-streaming build; its runs compile in weight-streaming mode."""


@dataclass(frozen=True, kw_only=True)
class ContainerPlan:
    """What python-pt / python-ws will run, and the notices it prints first."""

    argv: list[str]
    unset: tuple[str, ...] = ()
    """Variables to remove from the environment before running argv."""
    setenv: dict[str, str] = field(default_factory=dict)
    """Variables to set in the environment before running argv."""
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
    build: PythonBuild = PYTHON_PT,
) -> ContainerPlan:
    """The argv for ``python-pt ARGS`` (or another ``build``): ``RUNTIME exec [--nv] [--env K=V]
    [--bind a,b] IMAGE python3 ARGS``, or this Python.

    ``multi_task``: the job has several tasks, so ARGS run under :func:`abort_on_failure`.
    """
    prog, image, setenv = build.prog, build.image(site), dict(build.setenv)
    if multi_task:
        args = abort_on_failure(args)
    if not image or runtime is None:
        why = (f"no container image configured ({build.image_setting()})" if not image
               else f"no apptainer or singularity on PATH for image {image}")
        return ContainerPlan(argv=[sys.executable, *args], setenv=setenv,
                             notices=[f"{prog}: {why}; running {sys.executable}"])
    notices: list[str] = []
    binds = list(site.mount_dirs)
    if not binds or binds == [cwd]:
        notices.append(f"{prog}: warning: the only bind is the current directory ({cwd}); add data paths with --mount-dirs or the site's mount_dirs")
    unset = tuple(name for name in UNSET_FOR_CONTAINER if name in environ)
    if unset:
        notices.append(f"{prog}: unset {', '.join(unset)} for the container")
    argv = [runtime, "exec"]
    if gpus:
        argv.append("--nv")
    for name, value in setenv.items():
        argv += ["--env", f"{name}={value}"]
    if binds:
        argv += ["--bind", ",".join(binds)]
    argv += [image, CONTAINER_PYTHON, *args]
    return ContainerPlan(argv=argv, unset=unset, setenv=setenv, notices=notices)


def plan_for_this_task(args: list[str], site: SiteConfig, build: PythonBuild = PYTHON_PT) -> ContainerPlan:
    """:func:`container_plan` for this process: runtime on PATH, GPUs in /dev, the current folder."""
    return container_plan(
        args, site, os.environ, runtime=find_runtime(), gpus=gpus_visible(os.environ), cwd=os.getcwd(),
        multi_task=cluster_info().num_tasks > 1, build=build,
    )


def _script(argv: list[str]) -> str | None:
    """The script a Python argv runs (``python [-m mpi4py] SCRIPT ...``), or None (``-m``, ``-c``, ``-``)."""
    args = argv[1:]
    if args[:2] == ["-m", "mpi4py"]:
        args = args[2:]
    return args[0] if args and not args[0].startswith("-") else None


def exec_plan(plan: ContainerPlan, prog: str) -> int:
    """Print the plan's notices (the chief task only), then replace this process with its argv in the
    environment less ``plan.unset``, plus ``plan.setenv``; 127 (with one line) when it cannot start,
    2 when the script to run here is missing (one line from the chief; every task's last word says
    why, for the launcher's line: :mod:`csrun.task_exits`)."""
    info = cluster_info()
    if info.is_chief:
        for notice in plan.notices:
            print(notice, file=sys.stderr, flush=True)
    script = _script(plan.argv) if plan.argv[0] == sys.executable else None  # in an image: the image's paths
    if script is not None and not Path(script).is_file():
        why = f"cannot open the script {script!r}: {'it is a folder' if Path(script).is_dir() else 'no such file'}"
        last_word(2, info.rank, info.node_name, why)
        if info.is_chief:  # every task would say it: the chief does, once
            print(f"{prog}: error: {why} (in {os.getcwd()})", file=sys.stderr, flush=True)
        return 2
    env = {k: v for k, v in os.environ.items() if k not in plan.unset}
    env.update(plan.setenv)
    try:
        os.execvpe(plan.argv[0], plan.argv, env)
    except OSError as exc:
        print(f"{prog}: error: cannot run {plan.argv[0]!r}: {exc.strerror}", file=sys.stderr, flush=True)
        return 127
    return 0  # not reached: exec replaced this process
