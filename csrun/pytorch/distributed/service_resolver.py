"""``cstorch.distributed.service_resolver()``: the job's input workers as a :class:`ClusterSpec`.

The streamer tasks of the job are the workers of its one system: worker ``i`` is streaming rank
``i``, on the node Slurm (or the local launcher) put it. On a lone chief the chief is the one
worker.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

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
    rank = get_streaming_rank() if is_streamer() else 0
    host = socket.gethostname()
    tasks = [TaskSpec(rank=i, local_rank=i, wse_id=0, node_name=host if i == rank else "unknown")
             for i in range(workers)]
    return BaseServiceResolver(ClusterSpec(tasks=tasks, rank=rank, num_csx=1, num_workers_per_csx=workers))


__all__ = ["BaseServiceResolver", "service_resolver"]
