"""The one map from Slurm / MPI process state to who this task is.

``python -m csrun.cluster`` prints one line saying who the task is (a smoke test for launches).

Every task of a job runs the same script; this module tells it its rank, its role (rank 0 is
the **chief**, every other rank a **streamer**), its node and the size of the job. Nothing
else in csrun reads ``SLURM_*`` or ``PMI_*`` variables.

Variables read, first match wins for each item:

rank
    ``PMI_RANK`` (MPICH's mpiexec, and ``srun --mpi=pmi2``), ``OMPI_COMM_WORLD_RANK``,
    ``SLURM_PROCID`` (inside a step); else 0.
number of tasks
    ``PMI_SIZE``, ``OMPI_COMM_WORLD_SIZE``, ``SLURM_NTASKS`` (summed over the components of
    a heterogeneous step from ``SLURM_HET_SIZE`` and ``SLURM_NTASKS_HET_GROUP_<i>``
    when those are set); else 1. Slurm's counts are trusted only **inside a step**
    (``SLURM_STEP_ID`` set, as srun sets it): inside ``salloc -n 2`` or the body of an
    ``sbatch -n 4`` script, a plain ``python run.py`` is one task, and
    :attr:`ClusterInfo.allocation_tasks` says how many the allocation has (for a notice).
local rank
    ``MPI_LOCALRANKID`` (MPICH), ``OMPI_COMM_WORLD_LOCAL_RANK``, ``SLURM_LOCALID`` (inside a
    step); else 0.
tasks on this node
    ``MPI_LOCALNRANKS`` (MPICH's mpiexec); inside a Slurm step that is not heterogeneous
    (no ``SLURM_HET_SIZE``), this node's entry of ``SLURM_STEP_TASKS_PER_NODE`` (``2,1``,
    ``2(x3),1``) at ``SLURM_NODEID``, with the step on this node named
    ``<SLURM_JOB_ID>.<SLURM_STEP_ID>-node<SLURM_NODEID>``; else 0 (unknown) and ``""``.
node name
    ``SLURMD_NODENAME``; else the host name.
restarts
    ``SLURM_RESTART_COUNT``: how often Slurm requeued this job (0 on its first run).
launcher
    ``CSRUN_LAUNCHER`` (``csrun_cpu`` or ``csrun_wse``, set by the launchers) and
    ``CSRUN_LAUNCH_MODE`` (``slurm`` or ``local``); ``SLURM_JOB_ID`` for the job id.
device address
    ``CS_IP``: the device (emulator server) address a launcher exported (``csrun_wse
    --emulator`` sets it on the chief); kept as given, parsed where the run path is decided
    (:mod:`csrun.driver.run_path`).

Everything else in csrun asks :func:`cluster_info` (or the user API's state, which holds one)
for these values instead of reading the environment again.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Mapping


from csrun.env_settings import LAUNCH_MODE, LAUNCHER

CHIEF = "chief"
STREAMER = "streamer"


@dataclass(frozen=True, kw_only=True)
class ClusterInfo:
    """Who this task is inside its job."""

    rank: int
    """Global rank in the job's one MPI world; 0 is the chief."""
    num_tasks: int
    """All tasks of the job: the chief plus the streamers."""
    local_rank: int
    """Rank among the tasks on this node."""
    node_name: str
    """The Slurm node name (``SLURMD_NODENAME``) or the host name."""
    launcher: str
    """``csrun_cpu``, ``csrun_wse``, or ``""`` when started some other way."""
    launch_mode: str
    """``slurm`` when the tasks came from srun, ``local`` for the no-Slurm fallback, ``""`` when unknown."""
    job_id: str
    """The Slurm job id, or ``""``."""
    restart_count: int = 0
    """How often Slurm has requeued this job (a preempted run resumes when it is above 0)."""
    cs_ip: str = ""
    """The device address the launcher exported (``CS_IP``, stripped), or ``""``."""
    allocation_tasks: int = 0
    """Outside a Slurm step: the tasks the surrounding allocation has (``SLURM_NTASKS``), which
    this process does not count on; 0 inside a step or without Slurm."""
    local_tasks: int = 0
    """The tasks of this launch on this node, this one included; 0 when the launcher does not say."""
    node_step: str = ""
    """Inside a plain (not heterogeneous) Slurm step: ``<job>.<step>-node<node id>``, the same for
    every task of the step on this node; else ``""``."""

    @property
    def role(self) -> str:
        """``chief`` for rank 0, ``streamer`` for every other rank."""
        return CHIEF if self.rank == 0 else STREAMER

    @property
    def is_chief(self) -> bool:
        """True on rank 0."""
        return self.rank == 0

    @property
    def num_streamers(self) -> int:
        """How many tasks stream input to the chief (0 when the chief runs alone)."""
        return self.num_tasks - 1

    @property
    def streaming_rank(self) -> int:
        """This streamer's index among the streamers (0-based); 0 on a lone chief; -1 on a chief with streamers."""
        if self.rank == 0:
            return 0 if self.num_tasks == 1 else -1
        return self.rank - 1


def _first_int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return default


def _slurm_tasks(env: Mapping[str, str]) -> int | None:
    het_size = env.get("SLURM_HET_SIZE", "").strip()
    if het_size.isdigit():
        counts = [env.get(f"SLURM_NTASKS_HET_GROUP_{i}", "") for i in range(int(het_size))]
        if all(c.isdigit() for c in counts):
            return sum(int(c) for c in counts)
    value = env.get("SLURM_NTASKS", "").strip()
    return int(value) if value.isdigit() else None


def tasks_on_node(tasks_per_node: str, node_id: int) -> int | None:
    """This node's count in Slurm's ``SLURM_STEP_TASKS_PER_NODE`` form (``2,1``, ``2(x3),1``), or None."""
    nodes: list[int] = []
    for part in tasks_per_node.split(","):
        found = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if found is None:
            return None
        nodes += [int(found.group(1))] * int(found.group(2) or 1)
    return nodes[node_id] if 0 <= node_id < len(nodes) else None


def _node_step(env: Mapping[str, str], in_step: bool) -> tuple[int, str]:
    """(tasks of this launch on this node, the Slurm step on this node) -- see the module docstring."""
    hydra = env.get("MPI_LOCALNRANKS", "").strip()
    if hydra.isdigit():
        return int(hydra), ""
    if not in_step or env.get("SLURM_HET_SIZE", "").strip():
        return 0, ""
    job, node = env.get("SLURM_JOB_ID", "").strip(), env.get("SLURM_NODEID", "").strip()
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "")).strip()
    if not (job.isdigit() and step.isdigit() and node.isdigit()):
        return 0, ""
    count = tasks_on_node(env.get("SLURM_STEP_TASKS_PER_NODE", ""), int(node))
    return (count, f"{job}.{step}-node{node}") if count is not None else (0, "")


def cluster_info(environ: Mapping[str, str] | None = None) -> ClusterInfo:
    """Read this task's place in the job from the environment (``os.environ`` by default)."""
    env = os.environ if environ is None else environ
    in_step = bool(env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "")).strip())
    slurm = ("SLURM_PROCID",) if in_step else ()
    rank = _first_int(env, ("PMI_RANK", "OMPI_COMM_WORLD_RANK", *slurm), 0)
    launched = _first_int(env, ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"), 0)
    size = launched or (_slurm_tasks(env) if in_step else None) or 1
    local = _first_int(env, ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", *("SLURM_LOCALID",)[:len(slurm)]), 0)
    allocation = 0 if in_step or launched else (_slurm_tasks(env) or 0)
    local_tasks, node_step = _node_step(env, in_step)
    return ClusterInfo(
        rank=rank,
        num_tasks=max(size, rank + 1),
        local_rank=local,
        node_name=env.get("SLURMD_NODENAME") or socket.gethostname(),
        launcher=env.get(LAUNCHER.name, ""),
        launch_mode=env.get(LAUNCH_MODE.name, ""),
        job_id=env.get("SLURM_JOB_ID", ""),
        restart_count=_first_int(env, ("SLURM_RESTART_COUNT",), 0),
        cs_ip=env.get("CS_IP", "").strip(),
        allocation_tasks=allocation if allocation > 1 else 0,
        local_tasks=local_tasks,
        node_step=node_step,
    )


def allocation_notice(info: ClusterInfo) -> str | None:
    """The one-line notice for a process outside a Slurm step in a multi-task allocation, or None."""
    if not info.allocation_tasks:
        return None
    return (f"csrun: this allocation has {info.allocation_tasks} tasks, but this process was not started by srun: "
            "it runs as one task (a lone chief); launch the job with csrun_wse / srun to use them")


def describe(info: ClusterInfo) -> str:
    """One line saying who this task is, e.g. ``rank 1/4 streamer 0 on cs-w1 (csrun_wse, slurm job 12)``."""
    who = info.role if info.is_chief else f"{info.role} {info.streaming_rank}"
    how = ", ".join(x for x in (info.launcher, info.launch_mode, f"job {info.job_id}" if info.job_id else "") if x)
    return f"rank {info.rank}/{info.num_tasks} {who} on {info.node_name}" + (f" ({how})" if how else "")


if __name__ == "__main__":
    print(describe(cluster_info()), flush=True)
