"""Gradient clipping, as torch's ``clip_grad_norm_`` / ``clip_grad_value_`` compute it: one arithmetic for the device and the CPU.

The engine clips the unscaled gradients of an update (the program's ``max_gradient_norm`` /
``max_gradient_value``, or the step's own ``clip_grad_norm_`` call: :mod:`csrun.driver.clipping`);
the CPU path applies the compile settings' clipping with the same functions
(:mod:`csrun.torch.rules`), and the check against eager PyTorch (:mod:`csrun.driver.verify`)
too. ``max_gradient_norm`` bounds the total norm (``norm_type`` 2 unless the step says
otherwise), ``max_gradient_value`` each element; the legacy code refused both at once, and so
does :func:`check_clipping`.
"""

from __future__ import annotations

from typing import Sequence

import torch

from csrun.program.errors import SpecError


def check_clipping(max_gradient_norm: float | None, max_gradient_value: float | None) -> None:
    """Refuse bad clipping settings (non-positive, or both at once as the legacy code did)."""
    for key, val in (("max_gradient_norm", max_gradient_norm), ("max_gradient_value", max_gradient_value)):
        if val is not None and not (isinstance(val, (int, float)) and val > 0):
            raise SpecError(f"{key} must be a positive number, got {val!r}")
    if max_gradient_norm and max_gradient_value:
        raise SpecError("gradients can be clipped by norm (max_gradient_norm) or by value "
                        "(max_gradient_value), not both")


def gradient_norm(grads: Sequence[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """The total norm of the gradients, as ``torch.nn.utils.clip_grad_norm_`` computes it."""
    norms = torch._foreach_norm(list(grads), float(norm_type))
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]), float(norm_type))


def clip_gradients(grads: Sequence[torch.Tensor], *, max_norm: float | None, max_value: float | None,
                   norm_type: float = 2.0) -> torch.Tensor | None:
    """Clip unscaled gradients in place by their total norm or by value, as torch's
    ``clip_grad_norm_`` / ``clip_grad_value_`` do; the total norm (before clipping) when clipping
    by norm, else None."""
    if not grads:
        return None
    if max_value:
        torch._foreach_clamp_min_(list(grads), -float(max_value))
        torch._foreach_clamp_max_(list(grads), float(max_value))
    if not max_norm:
        return None
    total = gradient_norm(grads, norm_type)
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
    torch._foreach_mul_(list(grads), coef.to(grads[0].dtype))
    return total
