"""Loss scaling and gradient clipping, applied between backward and the optimizer update.

Fixed scaling multiplies the loss by ``factor`` before backward and divides the gradients by it
after; it never skips an update (the system's static scaling). Dynamic scaling (``factor:
"dynamic"``) starts at ``initial_loss_scale``; a step whose unscaled gradients hold inf/NaN is an
overflow: the update is skipped, the scale halves (not below ``min_loss_scale``) and the count of
good steps restarts; after ``steps_per_increase`` good steps in a row the scale doubles (not above
``max_loss_scale``). The global step advances on skipped steps too, as on the system.

Clipping, which runs after unscaling, is :mod:`csrun.program.clipping`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from csrun.program.errors import SpecError
from csrun.program.loss_scaling import (
    INITIAL_LOSS_SCALE,
    MAX_LOSS_SCALE,
    MIN_LOSS_SCALE,
    STEPS_PER_INCREASE,
)


@dataclass(kw_only=True)
class ScalerState:
    """The loss scaler's state, part of the device state (checkpointed as ``amp``)."""

    scale: float
    """The current loss scale."""
    good_steps: int = 0
    """Steps since the last overflow or increase."""
    overflows: int = 0
    """Skipped updates so far."""


class LossScaler:
    """Fixed or dynamic loss scaling for one program."""

    def __init__(
        self,
        *,
        factor: float | str = 1.0,
        initial_loss_scale: float = INITIAL_LOSS_SCALE,
        steps_per_increase: int = STEPS_PER_INCREASE,
        min_loss_scale: float = MIN_LOSS_SCALE,
        max_loss_scale: float = MAX_LOSS_SCALE,
    ) -> None:
        """Validate and set up; raises :class:`SpecError` naming a bad value."""
        if isinstance(factor, str):
            if factor.lower() != "dynamic":
                try:
                    factor = float(factor)
                except ValueError:
                    raise SpecError(
                        f"loss_scaling_factor: {factor!r} is neither a number nor \"dynamic\""
                    ) from None
        self.dynamic = isinstance(factor, str)
        if self.dynamic:
            for key, val in (("initial_loss_scale", initial_loss_scale), ("min_loss_scale", min_loss_scale),
                             ("max_loss_scale", max_loss_scale)):
                if not (isinstance(val, (int, float)) and math.isfinite(val) and val > 0):
                    raise SpecError(f"{key} must be a positive number, got {val!r}")
            if not (isinstance(steps_per_increase, int) and steps_per_increase > 0):
                raise SpecError(f"steps_per_increase must be a positive integer, got {steps_per_increase!r}")
            if min_loss_scale > max_loss_scale:
                raise SpecError(f"min_loss_scale {min_loss_scale} is above max_loss_scale {max_loss_scale}")
            start = min(max(float(initial_loss_scale), min_loss_scale), max_loss_scale)
        else:
            if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
                raise SpecError(f"loss_scaling_factor must be a positive number or \"dynamic\", got {factor!r}")
            start = float(factor)
        self.steps_per_increase = int(steps_per_increase)
        self.min_scale = float(min_loss_scale)
        self.max_scale = float(max_loss_scale)
        self.state = ScalerState(scale=start)

    @property
    def scale(self) -> float:
        """The current scale."""
        return self.state.scale

    def unscale_and_check(self, grads: Sequence[torch.Tensor]) -> bool:
        """Divide ``grads`` by the scale in place; return True when the step overflowed.

        Only dynamic scaling reports overflow (one device-to-host read of a flag).
        """
        if not grads:
            return False
        scale = self.state.scale
        if not self.dynamic:
            if scale != 1.0:
                torch._foreach_mul_(list(grads), 1.0 / scale)
            return False
        device = grads[0].device
        found = torch.zeros((), dtype=torch.float32, device=device)
        inv = torch.full((), 1.0 / scale, dtype=torch.float32, device=device)
        by_key: dict[tuple[Any, Any], list[torch.Tensor]] = {}
        for g in grads:
            by_key.setdefault((g.device, g.dtype), []).append(g)
        for (dev, _), group in by_key.items():
            f = found if dev == device else torch.zeros((), dtype=torch.float32, device=dev)
            torch._amp_foreach_non_finite_check_and_unscale_(group, f, inv.to(dev))
            if f is not found:
                found += f.to(device)
        return bool(found.item() > 0)

    def update(self, overflow: bool) -> None:
        """Advance the dynamic-scaling state after a step."""
        if not self.dynamic:
            return
        st = self.state
        if overflow:
            st.scale = max(st.scale / 2.0, self.min_scale)
            st.good_steps = 0
            st.overflows += 1
            return
        st.good_steps += 1
        if st.good_steps >= self.steps_per_increase:
            st.scale = min(st.scale * 2.0, self.max_scale)
            st.good_steps = 0

    def state_dict(self) -> dict[str, Any]:
        """The scaler state as plain values."""
        return {"scale": self.state.scale, "good_steps": self.state.good_steps,
                "overflows": self.state.overflows, "dynamic": self.dynamic}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.state = ScalerState(scale=float(state["scale"]), good_steps=int(state.get("good_steps", 0)),
                                 overflows=int(state.get("overflows", 0)))
