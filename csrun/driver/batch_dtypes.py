"""The dtypes a device step's batch reaches the model in: the widths eager PyTorch computes in.

The system's input pipelines streamed int32 token ids and labels and float16 inputs, and its
kernels took them as they were (the R1.x Model Zoo makes them so on its CS path). Eager PyTorch
does not: ``nll_loss`` wants int64 targets, a float32 ``Linear`` refuses a float16 input. The
device takes the model's weights in float32 and computes in 16 bits itself (mixed precision), so
a batch's int32 leaves are handed to the step as int64 and its float16 / bfloat16 leaves as
float32: the same values, in the widths the script's own CPU run feeds the model.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

WIDER: dict[torch.dtype, torch.dtype] = {torch.int32: torch.int64, torch.float16: torch.float32,
                                         torch.bfloat16: torch.float32}
"""A batch leaf's dtype -> the dtype the step gets it in."""


def widened(batch: Any) -> Any:
    """``batch`` with its int32 / float16 / bfloat16 tensors widened (the others as they are; a batch
    with none to widen is returned as it is)."""
    if not any(isinstance(t, torch.Tensor) and t.dtype in WIDER for t in pytree.tree_leaves(batch)):
        return batch
    return pytree.tree_map(lambda t: t.to(WIDER[t.dtype]) if isinstance(t, torch.Tensor) and t.dtype in WIDER
                           else t, batch)
