"""The task layout of a csrun_wse job: which Slurm components, how many nodes and tasks each.

The legacy shapes:

* 1 node: one component, ``T`` tasks, holding the GRES.
* N > 1, S = 0: the chief's component (1 node, ``T`` tasks, the GRES) and one worker
  component (``N-1`` nodes, ``T`` tasks each).
* N > 1, S > 0: ``S`` one-task components of one node each (the first holds the GRES), then
  ``N-S`` nodes with ``T`` tasks each. 5 nodes, S=2, T=4 gives 1 + 1 + 12 = 14 tasks.

A cluster of ``C`` > 1 systems (``csrun_wse --num-csx C``, :func:`cluster_layout`) is always a
heterogeneous step, whose components in order give the ranks of :mod:`csrun.cluster`:

1. the chief: 1 node, 1 task (rank 0), holding the site's GRES as today (the GRES node);
2. the systems: ``C`` nodes, 1 task each (ranks 1..C), each holding the site's GRES
   (``site.gres_resource``) on a node other than the chief's;
3. MemoryX: 1 node, 1 task (rank C+1);
4. the streamers: the remaining ``N-C-2`` nodes, ``T`` tasks each (ranks C+2..), ``--cyclic``
   applying to them; with ``--single-task-nodes S`` > 1 the first ``S-1`` of them run one task
   each (the chief is the first one-task node, as in the legacy shapes).

``N`` (``--total-nodes``) counts every node, so it is at least ``C + 3`` (:func:`min_cluster_nodes`).
Without Slurm the same layout's tasks run on this machine (``mpiexec -n``), in the same order.
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
    """True for components that only run streamers (``--exclusive``, ``--cyclic`` applies), and
    for a cluster's MemoryX component (exclusive, off the GRES and system nodes)."""
    systems: bool = False
    """True for a cluster's systems component: every task holds a system's GRES, on a node of its own."""

    @property
    def tasks(self) -> int:
        """Tasks in this component."""
        return self.nodes * self.tasks_per_node


@dataclass(frozen=True, kw_only=True)
class Layout:
    """All components of one job, the chief's first."""

    components: tuple[Component, ...]
    cyclic: bool = False
    num_csx: int = 1
    """The systems of the job's cluster; above 1 the components are :func:`cluster_layout`'s."""

    @property
    def total_tasks(self) -> int:
        """Tasks over all components: the chief plus the streamers (and a cluster's systems and MemoryX)."""
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


def wse_layout(*, nodes: int, tasks_per_node: int, cpus_per_task: int, single_task_nodes: int, cyclic: bool,
               num_csx: int = 1) -> Layout:
    """The legacy component layout for ``nodes`` nodes (``num_csx`` > 1: :func:`cluster_layout`'s); raise
    UsageError for an impossible one."""
    if num_csx > 1:
        return cluster_layout(num_csx=num_csx, nodes=nodes, tasks_per_node=tasks_per_node, cpus_per_task=cpus_per_task,
                              single_task_nodes=single_task_nodes, cyclic=cyclic)
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


def min_cluster_nodes(num_csx: int) -> int:
    """The fewest nodes a cluster of ``num_csx`` systems runs on: the chief, the systems, MemoryX and
    one streamer node."""
    return num_csx + 3


def cluster_layout(*, num_csx: int, nodes: int, tasks_per_node: int, cpus_per_task: int, single_task_nodes: int,
                   cyclic: bool) -> Layout:
    """The layout of a cluster of ``num_csx`` > 1 systems on ``nodes`` nodes (module docstring); raise
    UsageError for too few nodes or too many one-task nodes."""
    least = min_cluster_nodes(num_csx)
    if nodes < least:
        raise UsageError(f"'--num-csx {num_csx}' needs at least {least} nodes (the chief, {num_csx} systems, MemoryX and "
                         f"one streamer node), but '--total-nodes' is {nodes}: give '--total-nodes {least}' or more, "
                         "or fewer systems")
    streamer_nodes = nodes - num_csx - 2
    singles = max(single_task_nodes - 1, 0)
    if singles >= streamer_nodes:
        raise UsageError(f"ERROR: '--single-task-nodes' ({single_task_nodes}) must be less than the chief's and the "
                         f"streamers' nodes ({streamer_nodes + 1} of the {nodes}: {num_csx} run the systems, 1 MemoryX)")

    chief = Component(nodes=1, tasks_per_node=1, cpus_per_task=cpus_per_task, gres=True, worker=False)
    systems = Component(nodes=num_csx, tasks_per_node=1, cpus_per_task=cpus_per_task, gres=True, worker=False,
                        systems=True)
    single = Component(nodes=1, tasks_per_node=1, cpus_per_task=cpus_per_task, gres=False, worker=True)
    rest = Component(nodes=streamer_nodes - singles, tasks_per_node=tasks_per_node, cpus_per_task=cpus_per_task,
                     gres=False, worker=True)
    components = (chief, systems, single, *([single] * singles), rest)  # single: MemoryX, then one-task streamers
    return Layout(components=tuple(components), cyclic=cyclic, num_csx=num_csx)
