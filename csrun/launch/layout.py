"""The task layout of a csrun_wse job: which Slurm components, how many nodes and tasks each.

The legacy shapes:

* 1 node: one component, ``T`` tasks, holding the GRES.
* N > 1, S = 0: the chief's component (1 node, ``T`` tasks, the GRES) and one worker
  component (``N-1`` nodes, ``T`` tasks each).
* N > 1, S > 0: ``S`` one-task components of one node each (the first holds the GRES), then
  ``N-S`` nodes with ``T`` tasks each. 5 nodes, S=2, T=4 gives 1 + 1 + 12 = 14 tasks.
"""

from __future__ import annotations

from dataclasses import dataclass

from csrun.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class Component:
    """One component of a (possibly heterogeneous) srun step."""

    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gres: bool
    """True for the chief's component: it asks for the system's GRES."""
    worker: bool
    """True for components that only run streamers (``--exclusive``, ``--cyclic`` applies)."""

    @property
    def tasks(self) -> int:
        """Tasks in this component."""
        return self.nodes * self.tasks_per_node


@dataclass(frozen=True, kw_only=True)
class Layout:
    """All components of one job, the chief's first."""

    components: tuple[Component, ...]
    cyclic: bool = False

    @property
    def total_tasks(self) -> int:
        """Tasks over all components: the chief plus the streamers."""
        return sum(c.tasks for c in self.components)

    @property
    def total_nodes(self) -> int:
        """Nodes over all components."""
        return sum(c.nodes for c in self.components)


def resolve_tasks_and_cpus(
    tasks_per_node: int | None,
    cpus_per_task: int | None,
    *,
    node_cpus: int,
    default_tasks: int,
    default_cpus: int,
) -> tuple[int, int]:
    """Tasks per node and CPUs per task; when only one is given, the other from the node size."""
    if tasks_per_node is not None and cpus_per_task is not None:
        return tasks_per_node, cpus_per_task
    if tasks_per_node is not None:
        return tasks_per_node, max(1, node_cpus // tasks_per_node)
    if cpus_per_task is not None:
        return max(1, node_cpus // cpus_per_task), cpus_per_task
    return default_tasks, default_cpus


def wse_layout(*, nodes: int, tasks_per_node: int, cpus_per_task: int, single_task_nodes: int, cyclic: bool) -> Layout:
    """The legacy component layout for ``nodes`` nodes; raise UsageError for an impossible one."""
    if nodes < 1:
        raise UsageError(f"'--total-nodes' ({nodes}) must be at least 1")
    if single_task_nodes and single_task_nodes >= nodes:
        raise UsageError(f"ERROR: '--single-task-nodes' ({single_task_nodes}) must be less than the number of nodes ({nodes})")
    if nodes == 1:
        return Layout(components=(Component(nodes=1, tasks_per_node=tasks_per_node, cpus_per_task=cpus_per_task, gres=True, worker=False),), cyclic=cyclic)
    if single_task_nodes == 0:
        chief = Component(nodes=1, tasks_per_node=tasks_per_node, cpus_per_task=cpus_per_task, gres=True, worker=False)
        workers = Component(nodes=nodes - 1, tasks_per_node=tasks_per_node, cpus_per_task=cpus_per_task, gres=False, worker=True)
        return Layout(components=(chief, workers), cyclic=cyclic)
    singles = [
        Component(nodes=1, tasks_per_node=1, cpus_per_task=cpus_per_task, gres=(i == 0), worker=(i > 0))
        for i in range(single_task_nodes)
    ]
    rest = Component(nodes=nodes - single_task_nodes, tasks_per_node=tasks_per_node, cpus_per_task=cpus_per_task, gres=False, worker=True)
    return Layout(components=(*singles, rest), cyclic=cyclic)
