"""``cstorch.distributed.service_resolver()``: the job's input workers as a :class:`ClusterSpec`.

The streamer tasks of the job are the workers of its one system: worker ``i`` is streaming rank
``i``, on the node Slurm (or the local launcher) put it. On a lone chief the chief is the one
worker. On a cluster of N systems (``csrun_wse --num-csx N``) the S streamers are
``num_workers_per_csx = S / N`` workers per system: streaming rank ``s`` is worker
``local_rank = s // N`` of system ``wse_id = s % N``, so the zoo's shard index
``local_rank * num_csx + wse_id`` is ``s`` again, and each system's batches come from its own
workers (the chief takes the stream's batches round-robin, N to a step, system i the i-th).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from csrun.cluster import cluster_info
from csrun.pytorch.distributed.cluster_resolver import ClusterSpec, TaskSpec
from csrun.torch.helpers import get_streaming_rank, is_streamer, num_streamers


@dataclass(frozen=True)
class BaseServiceResolver:
    """What the appliance told its input workers: the cluster."""

    cluster_spec: ClusterSpec
    """Every input worker and which one this task is."""


def service_resolver() -> BaseServiceResolver:
    """The job's cluster as this task sees it (see the module manual)."""
    workers = max(num_streamers(), 1)
    systems = cluster_info().num_csx
    rank = get_streaming_rank() if is_streamer() else 0
    host = socket.gethostname()
    tasks = [TaskSpec(rank=i, local_rank=i // systems, wse_id=i % systems, node_name=host if i == rank else "unknown")
             for i in range(workers)]
    return BaseServiceResolver(ClusterSpec(tasks=tasks, rank=rank, num_csx=systems,
                                           num_workers_per_csx=max(workers // systems, 1)))


__all__ = ["BaseServiceResolver", "service_resolver"]
