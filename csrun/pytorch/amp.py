"""``cstorch.amp``: loss scaling, the optimizer step with clipping, and the half dtype.

:class:`GradScaler` is cbtorch's (:class:`csrun.torch.amp.GradScaler`: ``loss_scale``
``"dynamic"`` or a number, ``init_scale``, ``steps_per_increase``, ``min_loss_scale``,
``max_loss_scale``; ``scale`` / ``unscale_`` / ``step`` / ``update`` / ``state_dict`` /
``load_state_dict``). On the CPU it scales as torch's ``GradScaler`` does (dynamic: torch's own
runs: an overflow skips the update and halves the scale); on the device the device's loss
scaler does the same with the scaler's settings, which building one hands to the compile
(the last scaler built is the run's).

:func:`optimizer_step` is the 2.x training step's tail::

    cstorch.amp.optimizer_step(loss, optimizer, grad_scaler, max_gradient_norm=1.0)

backward (scaled when a scaler is given), unscale, clip the global norm
(``max_gradient_norm``) or each element (``max_gradient_value``) with torch's
``clip_grad_norm_`` / ``clip_grad_value_`` (on the device the step's clipping:
:mod:`csrun.driver.clipping`), the optimizer step (skipped on an overflow), the scaler's
update, then ``optimizer.zero_grad()``: as on the device, one step's gradients never reach the
next (a loop that zeroes them too is unchanged).

:func:`set_half_dtype` chooses the 16-bit type, as 2.2.1's does: ``torch.float16`` (the
default), ``torch.bfloat16`` (on the device it runs as cbfloat16), ``"cbfloat16"``, or
``torch.float32`` / None for none; it returns the proxy ``torch.dtype`` a model casts to
(``torch.float16`` for cbfloat16), which :func:`get_half_dtype` returns afterwards. Choosing
a type switches nothing on: the backend's ``mixed_precision`` is the switch
(:mod:`csrun.pytorch.backends`). :func:`autocast` is torch's bfloat16 autocast on a CPU backend
with mixed precision, and a context that changes nothing otherwise.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from csrun.compiler.spec import LossScalingSpec
from csrun.program.clipping import check_clipping
from csrun.errors import UserError
from csrun.program.loss_scaling import INITIAL_LOSS_SCALE, MAX_LOSS_SCALE, MIN_LOSS_SCALE, STEPS_PER_INCREASE
from csrun.pytorch.backends import HalfDtype, current_backend, training_settings, update_settings
from csrun.torch import amp as cbtorch_amp


class AmpError(UserError):
    """An amp argument csrun cannot use."""


class GradScaler(cbtorch_amp.GradScaler):
    """cbtorch's loss scaler whose settings become the device's (see the module manual)."""

    def __init__(self, loss_scale: str | float = "dynamic", init_scale: float | None = None,
                 steps_per_increase: int | None = None, min_loss_scale: float | None = None,
                 max_loss_scale: float | None = None, overflow_tolerance: float = 0.0,
                 max_gradient_norm: float | None = None) -> None:
        """None for a setting is its default (as 2.2.1); ``overflow_tolerance`` must be 0 (every
        overflow skips its step); give clipping to :func:`optimizer_step`, not here."""
        init_scale = INITIAL_LOSS_SCALE if init_scale is None else init_scale
        steps_per_increase = STEPS_PER_INCREASE if steps_per_increase is None else steps_per_increase
        min_loss_scale = MIN_LOSS_SCALE if min_loss_scale is None else min_loss_scale
        max_loss_scale = MAX_LOSS_SCALE if max_loss_scale is None else max_loss_scale
        if overflow_tolerance:
            raise AmpError(f"GradScaler(overflow_tolerance={overflow_tolerance!r}): the device skips every step "
                           f"that overflows; leave overflow_tolerance at 0")
        if max_gradient_norm is not None:
            raise AmpError("GradScaler(max_gradient_norm=...): give it to cstorch.amp.optimizer_step(..., "
                           "max_gradient_norm=...)")
        super().__init__(loss_scale=loss_scale, init_scale=init_scale, steps_per_increase=steps_per_increase,
                         min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale)
        factor: float | str = "dynamic" if self.static_scale is None else self.static_scale
        update_settings(loss_scaling=LossScalingSpec(factor=factor, initial_loss_scale=float(init_scale),
                                                     steps_per_increase=int(steps_per_increase),
                                                     min_loss_scale=float(min_loss_scale),
                                                     max_loss_scale=float(max_loss_scale)))


def optimizer_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, grad_scaler: GradScaler | None = None,
                   max_gradient_norm: float | None = None, max_gradient_value: float | None = None) -> None:
    """Backward, unscale, clip, step, update the scaler, zero the gradients (see the module manual)."""
    if grad_scaler is not None and not isinstance(grad_scaler, cbtorch_amp.GradScaler):
        raise AmpError(f"optimizer_step(grad_scaler=...) needs a cstorch.amp.GradScaler or None, got "
                       f"{type(grad_scaler).__name__}")
    check_clipping(max_gradient_norm, max_gradient_value)
    clipping = bool(max_gradient_norm or max_gradient_value)
    if grad_scaler is not None:
        grad_scaler.scale(loss).backward()
        if clipping:
            grad_scaler.unscale_(optimizer)
    else:
        loss.backward()
    if clipping:  # looked up now: on the device csrun's, which make it the step's clipping
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if max_gradient_norm:
            torch.nn.utils.clip_grad_norm_(params, max_gradient_norm)
        elif max_gradient_value:
            torch.nn.utils.clip_grad_value_(params, max_gradient_value)
    if grad_scaler is not None:
        grad_scaler.step(optimizer)
        grad_scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad()


_HALF: dict[Any, HalfDtype | None] = {torch.float16: "float16", torch.bfloat16: "bfloat16", "cbfloat16": "cbfloat16",
                                      "float16": "float16", "bfloat16": "bfloat16", torch.float32: None, None: None}
_PROXY: dict[HalfDtype | None, torch.dtype] = {"float16": torch.float16, "bfloat16": torch.bfloat16,
                                              "cbfloat16": torch.float16, None: torch.float32}


def set_half_dtype(dtype: Any) -> torch.dtype:
    """Choose the 16-bit type (``torch.float16``, ``torch.bfloat16``, ``"cbfloat16"``; ``torch.float32`` /
    None: none); returns the proxy dtype a model casts to. It switches nothing on (see the module manual)."""
    try:
        half = _HALF[dtype]
    except (KeyError, TypeError):
        raise AmpError(f"set_half_dtype({dtype!r}): give torch.float16, torch.bfloat16, 'cbfloat16', or "
                       f"torch.float32 for no half precision") from None
    update_settings(half_dtype=half)
    return _PROXY[half]


def get_half_dtype() -> torch.dtype:
    """The proxy dtype of the chosen 16-bit type (``torch.float16`` by default; see :func:`set_half_dtype`)."""
    return _PROXY[training_settings().half_dtype]


def get_half_dtype_str() -> str:
    """The chosen 16-bit type by name: ``float16``, ``bfloat16``, ``cbfloat16`` or ``float32`` (none)."""
    return training_settings().half_dtype or "float32"


def autocast(enabled: bool = True) -> Any:
    """On a CPU backend with mixed precision, torch's bfloat16 autocast; otherwise a context that
    changes nothing (the device computes in the half type itself when mixed precision is on)."""
    backend = current_backend()
    dtype = backend.autocast_dtype if backend is not None and enabled else None
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


__all__ = ["GradScaler", "AmpError", "optimizer_step", "set_half_dtype", "get_half_dtype", "get_half_dtype_str",
           "autocast"]
