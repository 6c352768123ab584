"""``cstorch.distributed.cluster_resolver``: the cluster as the input workers see it.

:class:`TaskSpec` is one input worker (its global ``rank``, its ``local_rank`` among the
workers of its system, the system's index ``wse_id``, its node); :class:`ClusterSpec` is all
of them with this task's ``rank``, the systems (``num_csx``) and workers per system.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskSpec:
    """One input worker."""

    rank: int
    """Its rank among the input workers (0-based)."""
    local_rank: int
    """Its rank among the workers that feed its system."""
    wse_id: int
    """The index of the system it feeds."""
    node_name: str = "unknown"
    """The node it runs on."""


@dataclass(frozen=True)
class ClusterSpec:
    """Every input worker, and which one this task is."""

    tasks: list[TaskSpec]
    """One per input worker."""
    rank: int
    """This task's index in :attr:`tasks`."""
    num_csx: int
    """Systems in the job."""
    num_workers_per_csx: int
    """Input workers per system."""

    def task(self) -> TaskSpec:
        """This task's spec."""
        return self.tasks[self.rank]

    def num_tasks(self) -> int:
        """Input workers in the job."""
        return len(self.tasks)


__all__ = ["TaskSpec", "ClusterSpec"]
