"""The refill check: an input pipeline must hand over new tensors for every batch.

A streamer sends a batch from its tensors while the next one loads, so a pipeline that writes
into tensors it already handed over (a ``collate_fn`` refilling preallocated ones) could send a
batch that mixes two. :func:`sent_in_place` notes each such leaf's in-place version counter when
a batch is handed over; :func:`check_untouched` refuses the pipeline (a :class:`BatchError`
naming the leaf) when a counter moved. The lone chief refuses the same pipelines.
"""

from __future__ import annotations

from typing import Sequence

import torch

from csrun.stream.errors import BatchError
from csrun.stream.schema import Schema, show_path


REFILL_WATCH = 2
"""How many of the last batches handed over a refill is checked against (a streamer has up to two
in flight; a pipeline alternating between two sets of tensors is caught at its third batch)."""


def whole_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` is the whole of its storage (then its version counter is its own)."""
    return t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.nbytes


def check_untouched(handed: Sequence[Sequence[tuple[str, torch.Tensor, int]]]) -> None:
    """:class:`BatchError` if the input pipeline wrote (with a torch in-place op) into a tensor of a
    batch it had handed over (``handed``: :func:`sent_in_place` of each such batch, taken when
    it was handed over): a streamer may still be sending it, and a chief's streamed batch could mix
    two. The lone chief refuses it too (it copies, but a CPU run refuses what a streamed run would)."""
    for watched in handed:
        for path, tensor, version in watched:
            if tensor._version != version:
                raise BatchError(
                    f"the input pipeline wrote into the tensor at {show_path(path)} of a batch it had already "
                    "handed over (a collate_fn or dataset that refills the same tensors): csrun streams each "
                    "batch from its tensors while the next one loads; return new tensors for every batch "
                    "(torch's default_collate does)")


def sent_in_place(schema: Schema, tensors: Sequence[torch.Tensor]) -> list[tuple[str, torch.Tensor, int]]:
    """``(path, tensor, version)`` of each leaf (``tensors``: the batch's :meth:`Schema.flatten`) that
    :meth:`Schema.encode` sends from the batch's own memory (contiguous, not narrowed), with its
    in-place version counter now: a sender in flight reads that memory until its send
    completes. Only tensors that are the whole of their storage: a view's counter (or that of a
    tensor detached from one) is the whole storage's, which moves with writes anywhere in it;
    inference-mode tensors have no counter."""
    return [(leaf.path, t, t._version) for leaf, t in zip(schema.leaves, tensors)
            if leaf.wire_dtype == leaf.dtype and whole_storage(t) and not t.is_inference()]

