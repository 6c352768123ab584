"""The one map from Slurm / MPI process state to who this task is.

``python -m csrun.cluster`` prints one line saying who the task is (a smoke test for launches).

Every task of a job runs the same script; this module tells it its rank, its role (rank 0 is
the **chief**, every other rank a **streamer**), its node and the size of the job. Nothing
else in csrun reads ``SLURM_*`` or ``PMI_*`` variables.

A job of a cluster of N > 1 systems (``csrun_wse --num-csx N``, which sets ``CSRUN_NUM_CSX``)
has two more roles, in rank order: ranks 1..N are the **systems** and rank N+1 is **MemoryX**
(:mod:`csrun.emulator.swarm`); the streamers are the ranks after. The chief and the streamers
form the job's *input* group (:attr:`ClusterInfo.input_tasks`, :attr:`ClusterInfo.input_rank`:
the chief 0, the streamers 1..S), which is what the user API's ``num_tasks()`` and collectives
count.

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


from csrun.env_settings import LAUNCH_MODE, LAUNCHER, NUM_CSX
from csrun.errors import ConfigError

CHIEF = "chief"
STREAMER = "streamer"
SYSTEM = "system"
MEMORYX = "memoryx"


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
    num_csx: int = 1
    """The systems of the job's cluster (``CSRUN_NUM_CSX``); 1: one system, no cluster roles."""

    @property
    def swarm_tasks(self) -> int:
        """The cluster's systems and MemoryX (N + 1 when N > 1; 0 for one system)."""
        return self.num_csx + 1 if self.num_csx > 1 else 0

    @property
    def role(self) -> str:
        """``chief`` for rank 0; ``system`` / ``memoryx`` for a cluster's ranks 1..N / N+1; else ``streamer``."""
        if self.rank == 0:
            return CHIEF
        if self.rank <= self.swarm_tasks:
            return SYSTEM if self.rank <= self.num_csx else MEMORYX
        return STREAMER

    @property
    def is_chief(self) -> bool:
        """True on rank 0."""
        return self.rank == 0

    @property
    def in_swarm(self) -> bool:
        """True on a cluster's system and MemoryX tasks (they run no user code)."""
        return self.role in (SYSTEM, MEMORYX)

    @property
    def input_tasks(self) -> int:
        """The chief and the streamers: the tasks of the input group."""
        return self.num_tasks - self.swarm_tasks

    @property
    def input_rank(self) -> int:
        """Rank in the input group (the chief 0, the streamers 1..S); -1 on a system or MemoryX."""
        if self.rank == 0:
            return 0
        return -1 if self.in_swarm else self.rank - self.swarm_tasks

    @property
    def streamer_ranks(self) -> list[int]:
        """The streamers' ranks in the job's world (after the cluster's systems and MemoryX)."""
        return list(range(self.swarm_tasks + 1, self.num_tasks))

    @property
    def num_streamers(self) -> int:
        """How many tasks stream input to the chief (0 when the chief runs alone)."""
        return self.input_tasks - 1

    @property
    def streaming_rank(self) -> int:
        """This streamer's index among the streamers (0-based); 0 on a lone chief; -1 on a chief with
        streamers, and on a system or MemoryX."""
        if self.rank == 0:
            return 0 if self.input_tasks == 1 else -1
        return self.input_rank - 1 if self.input_rank > 0 else -1


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
        num_csx=_num_csx(env),
    )


def _num_csx(env: Mapping[str, str]) -> int:
    """``CSRUN_NUM_CSX`` as a count of systems; 1 when unset. Set by the launcher: a bad value is a
    :class:`~csrun.errors.ConfigError` naming it."""
    raw = env.get(NUM_CSX.name, "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{NUM_CSX.name}={raw!r}: the job's number of systems must be a whole number >= 1 "
                          "(csrun_wse --num-csx sets it; unset it for one system)")
    return int(raw)


def cluster_role(rank: int, num_csx: int) -> str:
    """What rank ``rank`` of a job of ``num_csx`` systems is, for a failure's line: ``system 1 of 2``,
    ``MemoryX``, ``chief``, ``streamer``; ``""`` in a job of one system (no cluster roles)."""
    if num_csx <= 1:
        return ""
    if rank == 0:
        return CHIEF
    if rank <= num_csx:
        return f"system {rank} of {num_csx}"
    return "MemoryX" if rank == num_csx + 1 else STREAMER


def allocation_notice(info: ClusterInfo) -> str | None:
    """The one-line notice for a process outside a Slurm step in a multi-task allocation, or None."""
    if not info.allocation_tasks:
        return None
    return (f"csrun: this allocation has {info.allocation_tasks} tasks, but this process was not started by srun: "
            "it runs as one task (a lone chief); launch the job with csrun_wse / srun to use them")


def describe(info: ClusterInfo) -> str:
    """One line saying who this task is, e.g. ``rank 1/4 streamer 0 on cs-w1 (csrun_wse, slurm job 12)``."""
    if info.role == STREAMER:
        who = f"{info.role} {info.streaming_rank}"
    elif info.role == SYSTEM:
        who = f"system {info.rank} of {info.num_csx}"
    else:
        who = info.role
    how = ", ".join(x for x in (info.launcher, info.launch_mode, f"job {info.job_id}" if info.job_id else "") if x)
    return f"rank {info.rank}/{info.num_tasks} {who} on {info.node_name}" + (f" ({how})" if how else "")


if __name__ == "__main__":
    print(describe(cluster_info()), flush=True)
