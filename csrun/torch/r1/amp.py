"""``cerebras.framework.torch.amp`` as R1.6 had it: a GradScaler that states the device's loss
scaling and clipping, called on the loss.

The R1.6 zoo builds ``amp.GradScaler(loss_scale=, initial_loss_scale=, steps_per_increase=,
min_loss_scale=, max_loss_scale=, max_gradient_norm=, mixed_precision=)`` from its params YAML
(each ``None`` when the YAML leaves it out) and trains with ``grad_scaler(loss).backward()``
then ``optimizer.step()``: the system scaled the loss, unscaled, clipped and skipped overflowed
updates itself. So does csrun: the scaler's arguments become the compile's loss scaling and
``max_gradient_norm`` (:mod:`csrun.torch.r1.settings`), and calling it hands the loss back for
``backward()`` (the device scales it). On the CPU nothing is scaled (the weights and the compute
are float32) and the eager backend clips at ``optimizer.step()`` as the device does.

:func:`state_dict` / :func:`load_state_dict` are the device's loss-scaler state (the ``amp``
entry of :func:`csrun.torch.get_state`); :func:`get_init_params` is the last scaler's arguments
(the zoo's ``GradientClipper`` stands down when they carry a ``max_gradient_norm``).
"""

from __future__ import annotations

import math
from typing import Any

from csrun.errors import UserError
from csrun.program.loss_scaling import INITIAL_LOSS_SCALE, MAX_LOSS_SCALE, MIN_LOSS_SCALE, STEPS_PER_INCREASE
from csrun.program.spec import LossScalingSpec
from csrun.torch import get_state, set_state
from csrun.torch.process_state import state
from csrun.torch.r1 import settings

_init_params: dict[str, Any] = {}


class GradScalerError(UserError):
    """A GradScaler argument that does not fit (the message names it)."""


def _positive(name: str, value: Any, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise GradScalerError(f"amp.GradScaler({name}={value!r}): give a positive number (or leave it out)")
    return float(value)


class GradScaler:
    """The R1.6 scaler (see the module manual)."""

    def __init__(self, loss_scale: Any = None, initial_loss_scale: Any = None, steps_per_increase: Any = None,
                 min_loss_scale: Any = None, max_loss_scale: Any = None, max_gradient_norm: Any = None,
                 mixed_precision: bool = True) -> None:
        """The arguments as the zoo passes them (``None``: the default); they become the compile's."""
        factor: float | str = "dynamic" if loss_scale == "dynamic" else _positive("loss_scale", loss_scale, 1.0)
        spec = LossScalingSpec(
            factor=factor,
            initial_loss_scale=_positive("initial_loss_scale", initial_loss_scale, INITIAL_LOSS_SCALE),
            steps_per_increase=int(_positive("steps_per_increase", steps_per_increase, STEPS_PER_INCREASE)),
            min_loss_scale=_positive("min_loss_scale", min_loss_scale, MIN_LOSS_SCALE),
            max_loss_scale=_positive("max_loss_scale", max_loss_scale, MAX_LOSS_SCALE))
        if spec.min_loss_scale > spec.max_loss_scale:
            raise GradScalerError(f"amp.GradScaler(min_loss_scale={spec.min_loss_scale}, "
                                  f"max_loss_scale={spec.max_loss_scale}): the minimum is above the maximum")
        norm = None if max_gradient_norm in (None, 0, 0.0) else _positive("max_gradient_norm", max_gradient_norm, 0.0)
        global _init_params
        _init_params = {k: v for k, v in {
            "loss_scale": loss_scale, "initial_loss_scale": initial_loss_scale,
            "steps_per_increase": steps_per_increase, "min_loss_scale": min_loss_scale,
            "max_loss_scale": max_loss_scale, "max_gradient_norm": max_gradient_norm,
            "mixed_precision": mixed_precision}.items() if v is not None}
        settings.update(loss_scaling=spec, max_gradient_norm=norm, mixed_precision=bool(mixed_precision))
        self.loss_scaling = spec
        """The loss scaling the device runs."""

    def __call__(self, loss: Any) -> Any:
        """The loss to call ``backward()`` on (on the device the step's loss scaling applies to it)."""
        st = state()
        if st.options.uses_device:
            st.backend.loss_scaled(unscaled=False)
        return loss


def get_init_params() -> dict[str, Any]:
    """The last GradScaler's arguments that were given (``{}`` before one is built)."""
    return dict(_init_params)


def state_dict() -> dict[str, Any]:
    """The device's loss-scaler state (``{}`` on the CPU)."""
    return dict(get_state().get("amp", {}))


def load_state_dict(amp_state: dict[str, Any]) -> None:
    """Load a loss-scaler state saved by :func:`state_dict` (with the weights and optimizer as they are)."""
    current = get_state()
    current["amp"] = dict(amp_state)
    set_state(current, strict=False)


def reset_for_tests() -> None:
    """Forget the last scaler's arguments (tests only)."""
    global _init_params
    _init_params = {}
