"""``run.py ... --compile_only`` (or ``--validate_only``): compile BERT on torch's meta device, in seconds.

A normal compile builds BERT-Base (110M parameters) and runs its step once on the CPU at batch
256 x 128 to learn the shapes: a minute and 4.4 GB here. BERT's run.py compiles on meta tensors
instead (:mod:`csrun.run.shapes_only`: the rules, the ``--shapes_only`` flag, the exit codes),
with one ``mlm_nsp`` batch of the ``train_input`` (or ``eval_input``) shapes as the system
streams it: int32 ``input_ids`` / ``attention_mask`` / ``token_type_ids`` ``[batch_size,
max_sequence_length]``, int32 ``masked_lm_positions`` / ``masked_lm_ids`` and float32
``masked_lm_weights`` ``[batch_size, max_predictions_per_seq]``, int32 ``next_sentence_label``
``[batch_size]``. No data is read, so the data folder need not exist yet.
"""

from __future__ import annotations

from typing import Any

import torch

from csrun.run import shapes_only
from csrun.run.shapes_only import extra_args, wanted

__all__ = ["compile_shapes_only", "extra_args", "meta_batch", "wanted"]


def meta_batch(section: Any) -> dict[str, torch.Tensor]:
    """One ``mlm_nsp`` batch of meta tensors with the input section's shapes."""
    b, seq, predictions = section.batch_size, section.max_sequence_length, section.max_predictions_per_seq

    def meta(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device="meta")

    return {"input_ids": meta(b, seq), "attention_mask": meta(b, seq), "token_type_ids": meta(b, seq),
            "masked_lm_positions": meta(b, predictions), "masked_lm_ids": meta(b, predictions),
            "masked_lm_weights": meta(b, predictions, dtype=torch.float32), "next_sentence_label": meta(b)}


def compile_shapes_only(argv: list[str], **model: Any) -> int:
    """run.py's compile on meta tensors with BERT's batch (``model``: ``model_fn``, ``model_config``,
    ``input_config``, ``prog``)."""
    return shapes_only.compile_shapes_only(argv, meta_batch=meta_batch, **model)
