"""The input function, shaped like the 2.2.1 zoo's HDF5 map loaders: a self-sharding batch sampler
(the zoo's ``CBSampler``: batch ``i`` goes to input worker ``i % workers``), int32 labels and
float16 features on the CS path (every feature is exact in float16)."""

from __future__ import annotations

from typing import Any, Iterator

import torch

import cerebras.pytorch as cstorch
import cerebras.pytorch.distributed as dist
from cerebras.pytorch.distributed.cluster_resolver import ClusterSpec, TaskSpec

SAMPLES = 96
FEATURES = 6


class Samples(torch.utils.data.Dataset):
    """``SAMPLES`` samples: features in 1/64 steps, a label of 3 classes, the sample's id."""

    def __init__(self, half: bool, int32: bool) -> None:
        g = torch.Generator().manual_seed(7)
        self.x = (torch.randint(-64, 64, (SAMPLES, FEATURES), generator=g).float() / 64)
        self.y = (self.x[:, 0] > 0).long() + (self.x[:, 1] > 0.5).long()
        self.half, self.int32 = half, int32

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = self.x[i].to(cstorch.amp.get_half_dtype()) if self.half else self.x[i]
        y = self.y[i].to(torch.int32) if self.int32 else self.y[i]
        return {"x": x, "label": y, "id": torch.tensor(i)}


def cluster_config() -> tuple[ClusterSpec, TaskSpec]:
    """As the zoo's ``data/common/input_utils.cluster_config``."""
    if cstorch.use_cs() and dist.is_streamer():
        spec = dist.service_resolver().cluster_spec
        return spec, spec.task()
    task = TaskSpec(rank=0, local_rank=0, wse_id=0, node_name="unknown")
    return ClusterSpec([task], 0, 1, 1), task


class ShardingBatchSampler(torch.utils.data.Sampler):
    """Batches of ``batch_size`` in order; this worker's are every ``workers``-th, from its rank."""

    def __init__(self, n: int, batch_size: int) -> None:
        spec, task = cluster_config()
        self.n, self.batch_size = n, batch_size
        self.workers = spec.num_workers_per_csx * spec.num_csx
        self.rank = task.local_rank * spec.num_csx + task.wse_id

    def __iter__(self) -> Iterator[list[int]]:
        for b in range(self.n // self.batch_size):
            if b % self.workers == self.rank:
                yield list(range(b * self.batch_size, (b + 1) * self.batch_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.n // self.batch_size, self.workers))


def input_fn(params: dict[str, Any]) -> torch.utils.data.DataLoader:
    """The loader the executor streams (``params["train_input"]``)."""
    p = params["train_input"]
    use_cs = cstorch.use_cs()
    batch_size = dist.get_streaming_batch_size(p["batch_size"])
    dataset = Samples(half=use_cs and p["to_float16"], int32=use_cs)
    return torch.utils.data.DataLoader(dataset, batch_sampler=ShardingBatchSampler(len(dataset), batch_size))
