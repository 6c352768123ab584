"""``cstorch.distributed``: who this task is, for input code (the appliance's input workers).

On the system the user's process drove the appliance and the input workers were separate
processes, ``num_csx * num_workers_per_csx`` of them. Here the chief is the user's process and
the streamer tasks of the ``csrun_wse`` job are the input workers:

===============================  ===============================================================
``is_master_ordinal()``          True on the chief (the user node)
``is_streamer()``                True on an input worker (a streamer task)
``num_streamers()``              input workers in the job (0 when the chief runs alone)
``get_streaming_rank()``         0-based rank among the input workers (0 on a lone chief)
``get_ordinal()``                this task's rank among the chief and the streamers (0 is the chief)
``num_tasks()``                  every task of the job: the chief and the input workers
``get_streaming_batch_size(b)``  the batch one system streams: ``b`` over the job's systems
``get_worker_state()``           refused: csrun resumes the input at the checkpoint's step
``service_resolver()``           the cluster as the input workers see it
===============================  ===============================================================
"""

from __future__ import annotations

from csrun.pytorch.distributed import cluster_resolver
from csrun.pytorch.distributed.cluster_resolver import ClusterSpec, TaskSpec
from csrun.pytorch.distributed.service_resolver import BaseServiceResolver, service_resolver
from csrun.torch.helpers import get_ordinal, get_streaming_rank, is_master_ordinal, is_streamer, num_streamers
from csrun.torch.helpers import world_size as num_tasks
from csrun.torch.r1.unsupported import LegacyNameError, unsupported

WORKER_CACHE_ROOT = "/dev/shm/csrun_worker_cache"
"""Where the appliance's workers cached data sets (csrun has no worker cache: see ``hit_worker_cache_limit``)."""


def get_streaming_batch_size(effective_batch_size: int) -> int:
    """The batch one system streams: the effective batch over the job's systems (one here)."""
    if isinstance(effective_batch_size, bool) or not isinstance(effective_batch_size, int) or effective_batch_size < 1:
        raise LegacyNameError(f"get_streaming_batch_size({effective_batch_size!r}): give the effective batch size, "
                              f"a positive integer")
    return effective_batch_size // service_resolver().cluster_spec.num_csx


get_worker_state = unsupported(
    "cerebras.pytorch.distributed.get_worker_state",
    "csrun resumes the input itself at the checkpoint's global step; the input workers keep no state of their own")
hit_worker_cache_limit = unsupported(
    "cerebras.pytorch.distributed.hit_worker_cache_limit",
    "csrun has no worker-local data cache; leave use_worker_cache off")




__all__ = ["is_master_ordinal", "is_streamer", "num_streamers", "get_streaming_rank", "get_ordinal", "num_tasks",
           "get_streaming_batch_size", "get_worker_state", "hit_worker_cache_limit", "service_resolver",
           "BaseServiceResolver", "cluster_resolver", "ClusterSpec", "TaskSpec", "WORKER_CACHE_ROOT"]
