"""``cstorch.utils.data.SyntheticDataset``: the same sample, ``num_samples`` times (or without end).

``SyntheticDataset(sample, num_samples=None)``: ``sample`` is a tensor or a nested dict / list /
tuple of tensors; every index gives it. With ``num_samples`` it is a map-style dataset of that
length; without, ``len()`` raises ``TypeError`` and a loader needs a sampler that stops.
"""

from __future__ import annotations

from typing import Any

import torch

from csrun.pytorch.utils.data.data_executor import ExecutorError
from csrun.pytorch.utils.nest import visit_structure


class SyntheticDataset(torch.utils.data.Dataset):
    """The same sample at every index (see the module manual)."""

    def __init__(self, sample: Any, num_samples: int | None = None) -> None:
        leaves = list(visit_structure(sample, lambda x: isinstance(x, torch.Tensor), strict=True))
        if not leaves:
            raise ExecutorError("SyntheticDataset needs a tensor or a nested structure of tensors")
        if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)
                                        or num_samples < 1):
            raise ExecutorError(f"SyntheticDataset(num_samples={num_samples!r}): give a positive count or None")
        self.sample = sample
        self.num_samples = num_samples

    def __getitem__(self, index: int) -> Any:
        if self.num_samples is not None and not 0 <= index < self.num_samples:
            raise IndexError(index)
        return self.sample

    def __len__(self) -> int:
        if self.num_samples is None:
            raise TypeError("SyntheticDataset without num_samples has no length")
        return self.num_samples


__all__ = ["SyntheticDataset"]
