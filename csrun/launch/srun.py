"""The srun lines the launchers run: one exclusive node for csrun_cpu, the legacy step shapes for csrun_wse.

Pure argv building: nothing here runs a process, so unit tests compare the lines with golden
files.

Job names: a launcher's srun step and its ``--use-sbatch`` batch job are named
``<launcher>:<script>`` (``csrun_wse:run.py``; :func:`job_name`), so ``squeue`` tells one run
from another; a user's ``--job-name`` wins.
"""

from __future__ import annotations

import os
import re

from csrun.launch.layout import Component, Layout
from csrun.site import SiteConfig

WSE_STEP_FLAGS = ("--unbuffered", "--kill-on-bad-exit", "--quit-on-interrupt", "--mpi=pmi2")
"""Given once, in front of the first component: they hold for the whole (heterogeneous) step
(``--quit-on-interrupt``: the supervisor's SIGINT ends the step at once, :class:`~csrun.launch.supervisor.Stop`)."""


def script_name(command: list[str]) -> str:
    """What a job runs, in one word: the first argument that looks like a Python file
    (``models/fc_mnist/run.py`` -> ``run.py``), else the program's basename (``bash``)."""
    for word in command:
        if word.endswith(".py") and not word.startswith("-"):
            return os.path.basename(word)
    return os.path.basename(command[0]) if command else ""


def job_name(prog: str, command: list[str], given: str = "") -> str:
    """The job's name: ``given`` (the user's ``--job-name``), else ``<prog>:<script>``
    (:func:`script_name`); whitespace becomes ``_`` (an ``#SBATCH`` line ends at a space)."""
    name = given or (f"{prog}:{script_name(command)}" if command else prog)
    return re.sub(r"\s", "_", name)


def _placement(site: SiteConfig) -> list[str]:
    out = []
    if site.partition:
        out.append(f"--partition={site.partition}")
    if site.account:
        out.append(f"--account={site.account}")
    return out


def excluded_nodes(site: SiteConfig, *, gres_node: bool = True, system_nodes: bool = True) -> str:
    """The nodes a step keeps off, as one ``--exclude`` value: the GRES node and the site's system
    nodes (``site.system_nodes``), as asked and as the site names them; ``""`` for none."""
    return ",".join(x for x in (site.gres_node if gres_node else "", site.system_nodes if system_nodes else "") if x)


def component_excludes(component: Component, site: SiteConfig, layout: Layout) -> str:
    """The ``--exclude`` value of one component of a cluster's step (``layout.num_csx`` > 1): the chief
    keeps off the system nodes (it takes the GRES node), the systems off the GRES node, MemoryX and the
    streamers off both. ``""``: none (or a one-system layout, whose builders say their own)."""
    if layout.num_csx <= 1:
        return ""
    if component.systems:
        return excluded_nodes(site, system_nodes=False)
    if component.gres:
        return excluded_nodes(site, gres_node=False)
    return excluded_nodes(site)


def cpu_srun_argv(command: list[str], site: SiteConfig, *, exclude_gres: bool, pty: bool, name: str = "") -> list[str]:
    """``srun [--job-name=NAME] [--pty] --nodes=1 --exclusive [--exclude=GRES_NODE] COMMAND`` for csrun_cpu."""
    argv = ["srun"]
    if name:
        argv.append(f"--job-name={name}")
    if pty:
        argv.append("--pty")
    argv += ["--nodes=1", "--ntasks=1", "--exclusive", f"--cpus-per-task={site.def_cpus_per_task}"]
    argv += _placement(site)
    excludes = excluded_nodes(site) if exclude_gres else ""
    if excludes:
        argv.append(f"--exclude={excludes}")
    return argv + list(command)


def _component_argv(component: Component, site: SiteConfig, *, last: bool, layout: Layout, single_node: bool) -> list[str]:
    argv: list[str] = []
    if single_node:
        argv.append("--exclusive")
    argv += [f"--nodes={component.nodes}", f"--tasks-per-node={component.tasks_per_node}", f"--cpus-per-task={component.cpus_per_task}"]
    argv += _placement(site)
    if component.gres and site.gres_resource:
        argv.append(f"--gres={site.gres_resource}")
    if component.worker and last and layout.cyclic:
        argv.append("--distribution=cyclic")
    if component.worker or component.systems:
        argv.append("--exclusive")
    excludes = component_excludes(component, site, layout) if layout.num_csx > 1 else \
        (site.gres_node if component.worker else "")
    return argv + ([f"--exclude={excludes}"] if excludes else [])


def wse_srun_argv(command: list[str], layout: Layout, site: SiteConfig, *, name: str = "") -> list[str]:
    """The csrun_wse step: one component, or a heterogeneous step with ``:`` between components.

    Every component runs the same command; only the first asks for the GRES; worker
    components are exclusive and keep off the GRES node. ``name``: ``--job-name``, given once
    after the step flags (it names every component).

    A cluster's step (``layout.num_csx`` > 1): the chief asks for the GRES and keeps off the site's
    system nodes; the systems component asks for the GRES on each of its nodes, exclusive and off
    the GRES node; MemoryX and the streamers are exclusive and keep off both
    (:func:`component_excludes`). The task wrapper runs the swarm task on the systems and MemoryX.
    """
    argv = ["srun", *WSE_STEP_FLAGS]
    if name:
        argv.append(f"--job-name={name}")
    single_node = len(layout.components) == 1
    for i, component in enumerate(layout.components):
        if i:
            argv.append(":")
        argv += _component_argv(component, site, last=(i == len(layout.components) - 1), layout=layout, single_node=single_node)
        argv += list(command)
    return argv


def mpiexec_argv(mpiexec: str, command: list[str], layout: Layout) -> list[str]:
    """The no-Slurm fallback: every task of the layout on this machine under one mpiexec."""
    return [mpiexec, "-n", str(layout.total_tasks), *command]
