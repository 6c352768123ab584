"""The dtypes a device step's batch reaches the model in: float16 inputs as float32.

The system's input pipelines streamed float16 inputs, and its kernels took them as they were
(the Model Zoo makes them so on its CS path). Eager PyTorch does not: a float32 ``Linear``
refuses a float16 input. The device takes the model's weights in float32 and computes in 16
bits itself (mixed precision), so a batch's float16 / bfloat16 leaves are handed to the step as
float32: the same values, in the width the script's own CPU run feeds the model. Integer
leaves stay as they are (a model may check that its token ids are int32, as 2.2.1's GPT-2
does); the few torch functions that refuse an int32 index take one on the device path
(:mod:`csrun.driver.index_dtypes`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

WIDER: dict[torch.dtype, torch.dtype] = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
"""A batch leaf's dtype -> the dtype the step gets it in."""


def widened(batch: Any) -> Any:
    """``batch`` with its float16 / bfloat16 tensors widened (the others as they are; a batch
    with none to widen is returned as it is)."""
    if not any(isinstance(t, torch.Tensor) and t.dtype in WIDER for t in pytree.tree_leaves(batch)):
        return batch
    return pytree.tree_map(lambda t: t.to(WIDER[t.dtype]) if isinstance(t, torch.Tensor) and t.dtype in WIDER
                           else t, batch)
