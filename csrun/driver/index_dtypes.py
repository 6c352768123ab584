"""int32 class ids and indices where eager PyTorch asks for int64: the system's kernels took them.

The system's input pipelines stream int32 token ids and labels (the Model Zoo makes them so on
its CS path), and its kernels take them as they are. Most of eager PyTorch does too (embedding,
gather, scatter, indexing), but a few functions refuse an int32 index: ``nll_loss`` and
``cross_entropy`` targets, ``one_hot``, ``take_along_dim``. A batch cannot simply be widened
to int64 before the step, because a model may check its inputs' dtypes (2.2.1's GPT-2 asserts
int32). So on the device path, once per process, csrun puts a wrapper of each of those
functions where scripts look them up (``torch.nn.functional``, ``torch``): an int32 or int16
index argument is widened to int64 for the call, and nothing else changes (the values
are the same; without the wrapper torch raises). The wrapped call is what ``torch.export``
captures (a cast, then the op). Float16 inputs are widened where a device step opens
(:mod:`csrun.driver.batch_dtypes`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn.functional as F

NARROW_INDEX = (torch.int32, torch.int16)
"""Index dtypes widened to int64 for the wrapped functions."""

_WRAPPED: dict[str, tuple[Any, str, int, str]] = {
    "nll_loss": (F, "nll_loss", 1, "target"),
    "cross_entropy": (F, "cross_entropy", 1, "target"),
    "one_hot": (F, "one_hot", 0, "tensor"),
    "take_along_dim": (torch, "take_along_dim", 1, "indices"),
}
"""name -> (module, attribute, position of the index argument, its keyword)."""

_ORIGINAL: dict[str, Callable[..., Any]] = {}


def _wide(value: Any) -> Any:
    return value.long() if isinstance(value, torch.Tensor) and value.dtype in NARROW_INDEX else value


def _tolerant(name: str, original: Callable[..., Any], position: int, keyword: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) > position:
            args = (*args[:position], _wide(args[position]), *args[position + 1:])
        elif keyword in kwargs:
            kwargs[keyword] = _wide(kwargs[keyword])
        return original(*args, **kwargs)

    call.__csrun_index_wrapper__ = True  # type: ignore[attr-defined]
    return call


def install() -> None:
    """Wrap the functions that refuse int32 indices (once per process; see the module manual)."""
    if _ORIGINAL:
        return
    for name, (module, attribute, position, keyword) in _WRAPPED.items():
        original = getattr(module, attribute)
        _ORIGINAL[name] = original
        setattr(module, attribute, _tolerant(name, original, position, keyword))


__all__ = ["NARROW_INDEX", "install"]
