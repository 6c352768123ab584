"""The optimizer update without ``torch.optim``'s per-step wrappers, where that changes nothing.

``Optimizer.step()`` wraps the update in Python that a small model feels every step: a profiler
record, the grad-mode switch, the dynamo guard, the hook loops, ``_init_group``'s list building
and the functional dispatcher. For fc_mnist's 22 tensors that is more of the engine thread's
GIL per step than the update's own foreach kernels take (BENCHMARKS.md); the chief's loop waits for
that GIL. For the optimizers here the engine builds the lists itself and runs the update as one
TorchScript function (:func:`sgd_update`): the same foreach operations, in the same order, as
torch's own multi-tensor SGD (``torch.optim.sgd._multi_tensor_sgd``), so the numbers are torch's
bit for bit (``tests/emulator/test_lean_step.py`` compares them with ``torch.optim.SGD``), and the
whole update runs without taking the GIL between its operations. In every other case (or when a
condition below does not hold) the engine runs ``optimizer.step()``.

- **SGD** (``torch.optim.SGD`` itself, built with ``foreach=True`` as the engine builds it):
  every group with a float learning rate, dense gradients, not ``maximize``, ``differentiable``
  or ``fused``; with momentum, every buffer already created (the engine creates them before the
  first step: :func:`~csrun.program.optimizer_classes.preinitialize_state`); no step hooks on the
  optimizer or registered globally.

:class:`ScriptedUpdate` goes further for the common case of that SGD (one group holding the
engine's trainable weights, a static loss scale, no clipping): everything between the backward
and the next step — float16/bfloat16 emulation's rounding of the gradients
(:class:`~csrun.emulator.engine.half_emulation.HalfWeights`), the unscaling, the update — is that one
TorchScript call, and the gradients are cleared without ``zero_grad``'s loop. Why it matters
more than its own cost: the embedded engine shares the chief's GIL with the training loop,
and every moment the engine needs the GIL while the loop holds it (or the other way round) the
step waits. Measured on fc_mnist's engine (``bench/emulator/gil_neighbour.py``): beside a thread
that holds the GIL part of the time, the step slows down less with the scripted update than without
it, and is faster alone too; the README job ran faster with it (figures in BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Sequence

import torch
from torch.optim import optimizer as torch_optimizer

from csrun.emulator.engine.half_emulation import HalfWeights
from csrun.emulator.engine.torchscript import unoptimized


def _scale_(tensors: list[torch.Tensor], factor: float, float32: bool) -> None:
    """``tensors *= factor``. When every tensor is float32 (``float32``) the factor goes in as a
    float32 0-dim tensor: the same products bit for bit (the scalar is rounded to float32 either
    way), but a Python scalar is wrapped into a tensor once per tensor on a CPU (a cost per tensor
    that the 0-dim tensor saves: BENCHMARKS.md). A factor beyond float32's range, or NaN, stays
    a scalar (``torch.full`` refuses it; the scalar gives torch's inf or NaN products)."""
    # 3.4028234663852886e38: float32's largest, written out (TorchScript compiles this: no globals);
    # the tensor on the tensors' device (a GPU's fast path)
    if float32 and len(tensors) > 0 and abs(factor) <= 3.4028234663852886e38:
        torch._foreach_mul_(tensors, torch.full([], factor, dtype=torch.float32, device=tensors[0].device))
    else:
        torch._foreach_mul_(tensors, factor)


def _sgd_update(grads: list[torch.Tensor], params: list[torch.Tensor], buffers: list[torch.Tensor],
                low: list[torch.Tensor], wide: list[torch.Tensor], inv_scale: float, weight_decay: float,
                momentum: float, lr: float, dampening: float, nesterov: bool, float32: bool) -> None:
    """One SGD update of ``params`` (in place, under ``no_grad``): torch's ``_multi_tensor_sgd``'s
    foreach operations in its order. ``low``/``wide`` (empty, or one per gradient): round each
    gradient to ``low``'s 16-bit format first and use its float32 copy in ``wide``; ``inv_scale``
    != 1: unscale the gradients in place first; ``buffers``: the momentum buffers (empty without
    momentum); ``float32``: every gradient, weight and buffer is float32 (see :func:`_scale_`)."""
    if len(low) > 0:
        torch._foreach_copy_(low, grads)
        torch._foreach_copy_(wide, low)
        grads = wide
    if inv_scale != 1.0:
        _scale_(grads, inv_scale, float32)
    if weight_decay != 0.0:
        grads = list(torch._foreach_add(grads, params, alpha=weight_decay))
    if momentum != 0.0:
        _scale_(buffers, momentum, float32)
        torch._foreach_add_(buffers, grads, alpha=1 - dampening)
        if nesterov:
            torch._foreach_add_(grads, buffers, alpha=momentum)
        else:
            grads = buffers
    torch._foreach_add_(params, grads, alpha=-lr)


@functools.cache
def sgd_update() -> Callable[..., None]:
    """:func:`_sgd_update` as TorchScript, compiled at the first update (not at import: the eager
    ``--cpu`` path imports this module too and never updates through it)."""
    with warnings.catch_warnings():  # torch.jit.script is deprecated in torch 2.13 (csrun pins it): see traced_forward
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(_sgd_update)  # type: ignore[no-any-return]


def lean_step(optimizer: torch.optim.Optimizer) -> Callable[[], bool] | None:
    """A function that runs ``optimizer``'s next update the lean way and returns True, or returns
    False having changed nothing (the caller then runs ``optimizer.step()``); None for an
    optimizer without a lean form."""
    if type(optimizer) is torch.optim.SGD:
        return lambda: _sgd_step(optimizer)
    return None


def _hooked(optimizer: torch.optim.Optimizer) -> bool:
    return bool(optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks
                or torch_optimizer._global_optimizer_pre_hooks or torch_optimizer._global_optimizer_post_hooks)


def _same_tensors(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    """The same tensor objects, in the same order."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _lean_group(group: dict[str, Any]) -> bool:
    """Does this SGD group's update have the lean form?"""
    return bool(group.get("foreach") and not group.get("maximize") and not group.get("differentiable")
                and not group.get("fused") and type(group["lr"]) in (float, int))


def _buffers(optimizer: torch.optim.Optimizer, group: dict[str, Any],
             params: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """The group's momentum buffers for ``params`` ([] without momentum); None if one is missing."""
    if group["momentum"] == 0:
        return []
    buffers = []
    for p in params:
        state = optimizer.state.get(p)
        buffer = state.get("momentum_buffer") if state is not None else None
        if buffer is None:
            return None
        buffers.append(buffer)
    return buffers


def _all_float32(params: Sequence[torch.Tensor]) -> bool:
    """Are the weights float32? Then so are their gradients (autograd's rule) and momentum buffers
    (made like them; torch's ``load_state_dict`` casts loaded ones to them)."""
    return all(p.dtype is torch.float32 for p in params)


def _run(group: dict[str, Any], grads: list[torch.Tensor], params: list[torch.Tensor], buffers: list[torch.Tensor],
         low: list[torch.Tensor], wide: list[torch.Tensor], inv_scale: float, float32: bool) -> None:
    with torch.no_grad(), unoptimized():  # csrun.emulator.engine.torchscript: no optimization pass at its second call
        sgd_update()(grads, params, buffers, low, wide, inv_scale, float(group["weight_decay"]),
                     float(group["momentum"]), float(group["lr"]), float(group["dampening"]), bool(group["nesterov"]),
                     float32)


def _sgd_step(optimizer: torch.optim.Optimizer) -> bool:
    if _hooked(optimizer):
        return False
    plans: list[tuple[dict[str, Any], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]] = []
    for group in optimizer.param_groups:
        if not _lean_group(group):
            return False
        params = [p for p in group["params"] if p.grad is not None]
        grads = [p.grad for p in params]
        if any(g.is_sparse for g in grads):  # type: ignore[union-attr]  # p.grad is not None
            return False
        buffers = _buffers(optimizer, group, params)
        if buffers is None:
            return False
        plans.append((group, params, grads, buffers))  # type: ignore[arg-type]  # grads: p.grad is not None
    for group, params, grads, buffers in plans:
        if params:
            _run(group, grads, params, buffers, [], [], 1.0, _all_float32(params))
    return True


class ScriptedUpdate:
    """Everything after the backward as one TorchScript call, for one-group SGD (see the module
    docstring); build it with :func:`scripted_update`."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor], half: HalfWeights | None) -> None:
        self.optimizer = optimizer
        self.params = list(params)
        self.half = half
        self._wide = [torch.empty_like(p) for p in params] if half is not None else []
        self._float32 = _all_float32(self.params)
        """See :func:`_all_float32`; with ``half``, the float32 leaves' gradients and ``_wide`` are too."""

    def __call__(self, inv_scale: float) -> bool:
        """Update the weights from the backward's gradients (unscaled by ``inv_scale``) and clear
        the gradients; True. False, having changed nothing, when this step cannot take this form
        (the caller then runs the general path)."""
        optimizer, params, half = self.optimizer, self.params, self.half
        group = optimizer.param_groups[0]
        if _hooked(optimizer) or not _lean_group(group):
            return False
        holders: list[torch.Tensor] = half.leaves if half is not None else params
        if half is not None and any(p.grad is not None for p in params):
            return False  # a weight a float32 op read too: the general path adds its two gradients
        grads = [t.grad for t in holders]
        if any(g is None or g.is_sparse for g in grads):
            return False
        buffers = _buffers(optimizer, group, params)
        if buffers is None:
            return False
        low = half.low_buffers() if half is not None else []
        _run(group, grads, params, buffers, low, self._wide, inv_scale, self._float32)  # type: ignore[arg-type]  # no None left
        for t in holders:
            t.grad = None
        return True


def scripted_update(optimizer: torch.optim.Optimizer | None, params: Sequence[torch.Tensor],
                    half: HalfWeights | None) -> ScriptedUpdate | None:
    """A :class:`ScriptedUpdate` when ``optimizer`` is a ``torch.optim.SGD`` with one group holding
    exactly ``params`` (the engine's trainable weights, in order) and, with ``half``, every one of
    them a 16-bit-rounded weight in that order; else None."""
    if type(optimizer) is not torch.optim.SGD or len(optimizer.param_groups) != 1:
        return None
    if not _same_tensors(optimizer.param_groups[0]["params"], params):
        return None
    if half is not None and not (_same_tensors(half.masters, params) and all(leaf.requires_grad for leaf in half.leaves)):
        return None
    return ScriptedUpdate(optimizer, params, half)
