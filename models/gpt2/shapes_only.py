"""``run.py ... --compile_only`` (or ``--validate_only``): compile GPT on torch's meta device, in seconds.

GPT-3 XL has 1.3B parameters (5 GB of float32 weights, 16 GB more of AdamW state and gradients)
and a batch of 256 x 2048 tokens: building it for real, and running the step once on a CPU to
learn its shapes, does not fit this kind of machine in memory or time. So GPT's run.py compiles
on meta tensors (:mod:`csrun.run.shapes_only`: the rules, the ``--shapes_only`` flag, the exit
codes), with one batch of the ``train_input`` (or ``eval_input``) shapes: int32 ``input_ids`` /
``labels`` / ``attention_mask``, ``[batch_size, max_sequence_length]``. GPT-3 XL's compile stays
small (BENCHMARKS.md).
"""

from __future__ import annotations

from typing import Any

import torch

from csrun.run import shapes_only
from csrun.run.shapes_only import FLAG, extra_args, wanted

__all__ = ["FLAG", "compile_shapes_only", "extra_args", "meta_batch", "wanted"]


def meta_batch(section: Any) -> dict[str, torch.Tensor]:
    """One ``causal_lm`` batch of meta tensors with the input section's shapes."""
    shape = (section.batch_size, section.max_sequence_length)
    return {k: torch.empty(shape, dtype=torch.int32, device="meta") for k in ("input_ids", "labels", "attention_mask")}


def compile_shapes_only(argv: list[str], **model: Any) -> int:
    """run.py's compile on meta tensors with GPT's batch (``model``: ``model_fn``, ``model_config``,
    ``input_config``, ``prog``)."""
    return shapes_only.compile_shapes_only(argv, meta_batch=meta_batch, **model)
