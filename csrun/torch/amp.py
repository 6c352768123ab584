"""``cbtorch.amp``: the legacy ``GradScaler``, as R1.x loops call it.

::

    scaler = cbtorch.amp.GradScaler(loss_scale="dynamic")   # or a number: a static scale
    ...
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)                               # optional: to clip before step
    scaler.step(optimizer)
    scaler.update()
    state = scaler.state_dict(); scaler.load_state_dict(state)

Arguments (the legacy names): ``loss_scale`` (``"dynamic"``, default, or a positive number for a
static scale), ``init_scale`` (2**15), ``steps_per_increase`` (2000: overflow-free steps before the
dynamic scale doubles), ``min_loss_scale`` / ``max_loss_scale`` (1 and 2**24: bounds of the dynamic
scale; the defaults are :mod:`csrun.program.loss_scaling`'s),
``enabled`` (False: every call passes through).

**On the CPU** (eager) the scaler does what the legacy one did there: it multiplies the loss, and
``step`` unscales the gradients and skips the optimizer step when one is not finite (the step
still counts toward the global step, so the LR schedule stays where the device's is); the dynamic
scale halves on an overflow and doubles after ``steps_per_increase`` clean steps (torch's
``GradScaler`` on the CPU does the work). **On the device** the loss scaling is the device's, as
it was on the system (the compile settings' ``loss_scaling_factor``, dynamic by default): ``scale``
returns the loss unchanged, ``step`` is ``optimizer.step()``, ``update`` does nothing, and
``state_dict`` / ``get_scale`` read the device's scaler (its ``amp`` state in
:func:`csrun.torch.get_state`); ``load_state_dict`` loads it onto the device with the rest of the
state.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from csrun.errors import UserError
from csrun.program.loss_scaling import (
    INITIAL_LOSS_SCALE,
    MAX_LOSS_SCALE,
    MIN_LOSS_SCALE,
    STEPS_PER_INCREASE,
)
from csrun.torch.backend import EagerBackend
from csrun.torch.process_state import state


class GradScalerError(UserError):
    """A GradScaler argument that does not fit."""


def _on_device() -> bool:
    """True when the step is the device's (captured whole, compile_only and validate_only too): the
    scaling is the program's and the gradients exist only inside it."""
    return not isinstance(state().backend, EagerBackend)


class GradScaler:
    """The legacy loss scaler (see the module manual)."""

    def __init__(self, loss_scale: str | float = "dynamic", init_scale: float = INITIAL_LOSS_SCALE,
                 steps_per_increase: int = STEPS_PER_INCREASE, min_loss_scale: float = MIN_LOSS_SCALE,
                 max_loss_scale: float = MAX_LOSS_SCALE,
                 enabled: bool = True) -> None:
        dynamic = loss_scale in ("dynamic", None)
        if not dynamic:
            if isinstance(loss_scale, bool) or not isinstance(loss_scale, (int, float)) or not loss_scale > 0 \
                    or not math.isfinite(loss_scale):
                raise GradScalerError(f"GradScaler(loss_scale={loss_scale!r}): give 'dynamic' or a positive number")
        if not init_scale > 0 or not steps_per_increase >= 1 or not 0 < min_loss_scale <= max_loss_scale:
            raise GradScalerError(f"GradScaler: init_scale={init_scale!r}, steps_per_increase={steps_per_increase!r}, "
                                  f"min/max_loss_scale={min_loss_scale!r}/{max_loss_scale!r} do not fit (all positive, "
                                  f"min <= max)")
        self.enabled = enabled
        self.dynamic = dynamic
        self.static_scale = None if dynamic else float(loss_scale)
        self.min_loss_scale, self.max_loss_scale = float(min_loss_scale), float(max_loss_scale)
        self._torch = torch.amp.GradScaler("cpu", init_scale=float(init_scale), growth_interval=int(steps_per_increase),
                                           enabled=enabled and dynamic)
        self._skipped = 0
        self._unscaled: set[int] = set()
        """Optimizers whose gradients :meth:`unscale_` divided in this step (static scale)."""

    # -- the loop's calls ----------------------------------------------------------------------

    def scale(self, loss: Any) -> Any:
        """The loss multiplied by the current scale (on the device: the loss; the device scales)."""
        if not self.enabled:
            return loss
        if _on_device():
            state().backend.loss_scaled(unscaled=False)
            return loss
        if self.static_scale is not None:
            return loss * self.static_scale
        return self._torch.scale(loss)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the optimizer's gradients by the scale now (to clip them before :meth:`step`,
        which then does not divide again); on the device it does nothing (the device unscales)."""
        if not self.enabled:
            return
        if _on_device():
            state().backend.loss_scaled(unscaled=True)
            return
        if self.static_scale is None:
            self._torch.unscale_(optimizer)
            return
        if id(optimizer) not in self._unscaled:
            for g in optimizer.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        p.grad.div_(self.static_scale)
            self._unscaled.add(id(optimizer))

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale the gradients and step, unless one is inf/NaN (then the step is skipped)."""
        if not self.enabled or _on_device():
            optimizer.step()
            return
        if self.static_scale is not None:
            self.unscale_(optimizer)
            self._unscaled.discard(id(optimizer))
            grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            if all(bool(torch.isfinite(grad).all()) for grad in grads):
                optimizer.step()
            else:
                self._skipped += 1
                state().backend.skipped_step()
            return
        stepped: list[bool] = []
        hook = optimizer.register_step_post_hook(lambda *_: stepped.append(True))
        try:
            self._torch.step(optimizer)  # skips optimizer.step() when a gradient is inf/NaN
        finally:
            hook.remove()
        if not stepped:
            state().backend.skipped_step()

    def update(self) -> None:
        """Adjust the dynamic scale after the step (kept within min/max_loss_scale)."""
        if not self.enabled or _on_device() or self.static_scale is not None:
            return
        self._torch.update()
        scale = self._torch.get_scale()
        bounded = min(max(scale, self.min_loss_scale), self.max_loss_scale)
        if bounded != scale:
            self._torch.update(bounded)

    def get_scale(self) -> float:
        """The current loss scale."""
        if _on_device():
            return float(self.state_dict().get("scale", 1.0))
        if self.static_scale is not None:
            return self.static_scale if self.enabled else 1.0
        return float(self._torch.get_scale()) if self.enabled else 1.0

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state (the legacy ``amp`` entry of a checkpoint)."""
        if _on_device():
            from csrun.torch import get_state

            return dict(get_state().get("amp") or {})
        if self.static_scale is not None:
            return {"scale": self.static_scale, "static": True, "skipped": self._skipped}
        return dict(self._torch.state_dict())

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Load a state from :meth:`state_dict` (or a checkpoint's ``amp`` entry)."""
        if not isinstance(sd, dict):
            raise GradScalerError(f"GradScaler.load_state_dict needs a dict, got {type(sd).__name__}")
        if _on_device():
            from csrun.torch import get_state, set_state

            set_state({**get_state(), "amp": dict(sd)})
            return
        if self.static_scale is not None:
            self.static_scale = float(sd.get("scale", self.static_scale))
            self._skipped = int(sd.get("skipped", 0))
            return
        if sd:
            self._torch.load_state_dict(sd)
