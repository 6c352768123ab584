"""The optimizer update without ``torch.optim``'s per-step wrappers, where that changes nothing.

``Optimizer.step()`` wraps the update in Python that a small model feels every step: a profiler
record, the grad-mode switch, the dynamo guard, the hook loops, ``_init_group``'s list building
and the functional dispatcher. For fc_mnist's 22 tensors that is ~150 µs of the engine thread's
GIL per step, more than the update's own foreach kernels (~110 µs); the chief's loop waits for
that GIL. For the optimizers here the engine builds the lists itself and calls torch's own
multi-tensor function, so the arithmetic is torch's, bit for bit; in every other case (or when
a condition below does not hold) it runs ``optimizer.step()``.

- **SGD** (``torch.optim.SGD`` itself, built with ``foreach=True`` as the engine builds it):
  every group with a float learning rate, dense gradients, not ``maximize``, ``differentiable``
  or ``fused``; with momentum, every buffer already created (the engine creates them before the
  first step: :func:`~csrun.emulator.optimizers.preinitialize_state`); no step hooks on the
  optimizer or registered globally.

With a torch that lacks the private function (csrun installs torch 2.13), every update goes
through ``optimizer.step()``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.optim import optimizer as torch_optimizer

try:  # torch's private multi-tensor update (torch 2.13, the version csrun installs)
    from torch.optim.sgd import _multi_tensor_sgd
except ImportError:  # another torch without it: every update goes through optimizer.step()
    _multi_tensor_sgd = None  # type: ignore[assignment]


def lean_step(optimizer: torch.optim.Optimizer) -> Callable[[], bool] | None:
    """A function that runs ``optimizer``'s next update the lean way and returns True, or returns
    False having changed nothing (the caller then runs ``optimizer.step()``); None for an
    optimizer without a lean form."""
    if type(optimizer) is torch.optim.SGD and _multi_tensor_sgd is not None:
        return lambda: _sgd_step(optimizer)
    return None


def _hooked(optimizer: torch.optim.Optimizer) -> bool:
    return bool(optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks
                or torch_optimizer._global_optimizer_pre_hooks or torch_optimizer._global_optimizer_post_hooks)


def _sgd_step(optimizer: torch.optim.Optimizer) -> bool:
    if _hooked(optimizer):
        return False
    plans: list[tuple[dict[str, Any], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor | None]]] = []
    for group in optimizer.param_groups:
        if (not group.get("foreach") or group.get("maximize") or group.get("differentiable") or group.get("fused")
                or type(group["lr"]) not in (float, int)):
            return False
        params = [p for p in group["params"] if p.grad is not None]
        grads = [p.grad for p in params]
        if any(g.is_sparse for g in grads):
            return False
        buffers: list[torch.Tensor | None] = []
        if group["momentum"] != 0:
            for p in params:
                state = optimizer.state.get(p)
                buffer = state.get("momentum_buffer") if state is not None else None
                if buffer is None:
                    return False
                buffers.append(buffer)
        plans.append((group, params, grads, buffers))  # type: ignore[arg-type]  # grads: p.grad is not None
    with torch.no_grad():
        for group, params, grads, buffers in plans:
            _multi_tensor_sgd(params, grads, buffers, None, None, weight_decay=group["weight_decay"],
                              momentum=group["momentum"], lr=group["lr"], dampening=group["dampening"],
                              nesterov=group["nesterov"], maximize=False, has_sparse_grad=False)
    return True
