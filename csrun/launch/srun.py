"""The srun lines the launchers run: one exclusive node for csrun_cpu, the legacy step shapes for csrun_wse.

Pure argv building: nothing here runs a process, so unit tests compare the lines with golden
files.
"""

from __future__ import annotations

from csrun.launch.layout import Component, Layout
from csrun.site import SiteConfig

WSE_STEP_FLAGS = ("--unbuffered", "--kill-on-bad-exit", "--mpi=pmi2")
"""Given once, in front of the first component: they hold for the whole (heterogeneous) step."""


def _placement(site: SiteConfig) -> list[str]:
    out = []
    if site.partition:
        out.append(f"--partition={site.partition}")
    if site.account:
        out.append(f"--account={site.account}")
    return out


def cpu_srun_argv(command: list[str], site: SiteConfig, *, exclude_gres: bool, pty: bool) -> list[str]:
    """``srun --nodes=1 --exclusive [--exclude=GRES_NODE] [--pty] COMMAND`` for csrun_cpu."""
    argv = ["srun"]
    if pty:
        argv.append("--pty")
    argv += ["--nodes=1", "--ntasks=1", "--exclusive", f"--cpus-per-task={site.def_cpus_per_task}"]
    argv += _placement(site)
    if exclude_gres and site.gres_node:
        argv.append(f"--exclude={site.gres_node}")
    return argv + list(command)


def _component_argv(component: Component, site: SiteConfig, *, last: bool, layout: Layout, single_node: bool) -> list[str]:
    argv: list[str] = []
    if single_node:
        argv.append("--exclusive")
    argv += [f"--nodes={component.nodes}", f"--tasks-per-node={component.tasks_per_node}", f"--cpus-per-task={component.cpus_per_task}"]
    argv += _placement(site)
    if component.gres and site.gres_resource:
        argv.append(f"--gres={site.gres_resource}")
    if component.worker:
        if last and layout.cyclic:
            argv.append("--distribution=cyclic")
        argv.append("--exclusive")
        if site.gres_node:
            argv.append(f"--exclude={site.gres_node}")
    return argv


def wse_srun_argv(command: list[str], layout: Layout, site: SiteConfig) -> list[str]:
    """The csrun_wse step: one component, or a heterogeneous step with ``:`` between components.

    Every component runs the same command; only the first asks for the GRES; worker
    components are exclusive and keep off the GRES node.
    """
    argv = ["srun", *WSE_STEP_FLAGS]
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
