"""Compute precision of the forward pass: float16, bfloat16, cbfloat16, or float32.

Weights always stay float32 (the system kept fp32 master weights); only the forward's compute
is lowered. Backward runs through autograd on whatever the forward recorded.

- ``float16`` / ``bfloat16``: the ops ``torch.autocast`` would run low (matmuls and
  convolutions, and what follows them in 16 bits; reductions and losses stay float32), like the
  system's automatic casts. On CPU by default they run on float32 kernels with their operands
  and outputs rounded to the 16-bit format (:mod:`csrun.emulator.engine.half_emulation`: much faster
  than CPU autocast, see BENCHMARKS.md; the same numbers up to summation order); ``CSRUN_HALF_EMULATION=autocast``
  (the default on CUDA) runs the forward under ``torch.autocast`` instead.
- ``cbfloat16``: Cerebras' 16-bit format, 1 sign, 6 exponent, 9 mantissa bits (exponent bias 31;
  largest finite ``(2 - 2**-9) * 2**31``, smallest normal ``2**-30``). It is emulated on float32:
  the program's graph is rewritten so that every floating input, every weight as it is read, and
  every floating activation an op produces is rounded to the nearest cbfloat16 value (ties to
  even); ops themselves compute in float32, as a float32-accumulating datapath does. The rounding
  is straight-through for gradients (backward runs in float32 on the rounded saved values).
  See :func:`round_to_cbfloat16` for overflow and subnormals.
- ``float32``: no lowering. The system did not have it; it exists for exactness checks and
  emits a notice.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

import torch

from csrun.program.errors import SpecError
from csrun.program.spec import PRECISIONS, Precision

CB16_EXPONENT_BITS = 6
CB16_MANTISSA_BITS = 9
CB16_BIAS = 31
CB16_MAX = (2.0 - 2.0**-CB16_MANTISSA_BITS) * 2.0**31
"""Largest finite cbfloat16 value (exponent field 62; field 63 is inf/NaN, as in IEEE formats)."""
CB16_MIN_NORMAL = 2.0**-30
CB16_MIN_SUBNORMAL = 2.0**-39
"""Smallest positive (subnormal) value: ``2**-30 * 2**-9``."""

_DROP = 23 - CB16_MANTISSA_BITS  # float32 mantissa bits that are rounded away


def round_to_cbfloat16(x: torch.Tensor, *, subnormals: bool = True) -> torch.Tensor:
    """Round a float32 tensor to the nearest cbfloat16 value, returned as float32.

    Normal range: round to nearest, ties to even, on the 9-bit mantissa (a carry moves to the
    next binade). Overflow: magnitudes that round above :data:`CB16_MAX` become ``inf`` with the
    input's sign (IEEE round-to-nearest overflow). Below :data:`CB16_MIN_NORMAL`: with
    ``subnormals`` (default) gradual underflow to multiples of ``2**-39`` (ties to even, so values
    below ``2**-40`` become signed zero); without, values below the smallest normal flush to
    signed zero. ``inf`` and NaN pass through. Non-float32 tensors are returned unchanged.
    """
    if x.dtype != torch.float32:
        return x
    bits = x.view(torch.int32)
    lsb = (bits >> _DROP) & 1
    rounded = ((bits + ((1 << (_DROP - 1)) - 1) + lsb) & ~((1 << _DROP) - 1)).view(torch.float32)
    mag = x.abs()
    inf = torch.full_like(x, float("inf")).copysign(x)
    out = torch.where(rounded.abs() > CB16_MAX, inf, rounded)
    if subnormals:
        scale = 2.0**39
        sub = torch.round(x * scale) / scale  # exact: power-of-two scaling, round half to even
    else:
        sub = torch.zeros_like(x).copysign(x)
    out = torch.where(mag < CB16_MIN_NORMAL, sub, out)
    return torch.where(torch.isfinite(x), out, x)


class _RoundSTE(torch.autograd.Function):
    """cbfloat16 rounding with an identity gradient (straight-through)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return round_to_cbfloat16(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return grad


def cb16(x: Any) -> Any:
    """Round a float32 tensor to cbfloat16 (straight-through for autograd); anything else passes."""
    if isinstance(x, torch.Tensor) and x.dtype == torch.float32:
        return _RoundSTE.apply(x)
    return x


def apply_cbfloat16(gm: torch.fx.GraphModule) -> int:
    """Rewrite an unlifted program module in place so its forward computes in cbfloat16.

    Inserts :func:`cb16` after every floating placeholder (inputs), every ``get_attr`` of a
    floating parameter or buffer (weights as read) and every ``call_function`` that yields a
    floating tensor (activations), except values that only feed the graph's outputs (the loss
    comes back as computed, in float32). Returns the number of rounding points inserted.
    """
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        if node.op not in ("placeholder", "get_attr", "call_function"):
            continue
        if node.op == "call_function" and node.target is cb16:
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            if not val.dtype.is_floating_point:
                continue
        elif node.op != "placeholder" or val is not None:
            # tuples (handled by the getitem after them), symbols, None
            continue
        users = list(node.users)
        if not users or all(u.op == "output" for u in users):
            continue  # graph outputs (the loss) are handed back as computed, in float32
        with graph.inserting_after(node):
            r = graph.call_function(cb16, (node,))
        r.meta = dict(node.meta)
        for u in users:
            u.replace_input_with(node, r)
        count += 1
    graph.lint()
    gm.recompile()
    return count


def resolve_precision(precision: str, notice: Callable[[str], None]) -> Precision:
    """The precision the forward runs in; emits a notice for float32 (not a system mode)."""
    if precision not in PRECISIONS:
        raise SpecError(f"precision: unknown value {precision!r}; valid choices: {', '.join(PRECISIONS)}")
    if precision == "float32":
        notice("precision float32: the forward runs in full float32, an exactness-check mode the system did not have")
    return precision


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The 16-bit dtype a forward in ``precision`` runs under autocast (float16/bfloat16), else None."""
    return {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(precision)


def forward_context(precision: str, device: torch.device, *, cache: bool = True) -> ContextManager[Any]:
    """The context the forward runs in: autocast for float16/bfloat16, nothing otherwise.
    ``cache=False``: autocast casts a weight each time it is read (a CUDA graph's capture asks for
    it; the values are the same)."""
    dtype = autocast_dtype(precision)
    return contextlib.nullcontext() if dtype is None else torch.autocast(device_type=device.type, dtype=dtype,
                                                                         cache_enabled=None if cache else False)
