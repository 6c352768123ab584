"""The device's training semantics applied to an eager torch optimizer (the CPU path).

On the device the learning rate is a function of the global step
(:func:`csrun.program.schedules.build_schedule` of ``settings.learning_rate``), gradients are
clipped by ``max_gradient_norm`` / ``max_gradient_value`` after backward, and the global step
counts optimizer steps. :class:`TrainingRules` gives an eager ``torch.optim.Optimizer`` the same
behaviour through its step hooks (``register_step_pre_hook`` / ``register_step_post_hook``),
so a float32 run on the CPU and on the emulator produce the same weights.

Without settings, or with a learning rate of 0 (the "take it from the optimizer" default of
:class:`~csrun.compiler.CompileSettings`), the optimizer's own learning rate is left alone;
only the step count is kept.
"""

from __future__ import annotations

from typing import Any

import torch

from csrun.program.clipping import check_clipping, clip_gradients
from csrun.program.schedules import Schedule, build_schedule


class TrainingRules:
    """Learning-rate schedule, gradient clipping and the global step for eager optimizers."""

    def __init__(self, settings: Any = None) -> None:
        """``settings``: a :class:`~csrun.compiler.CompileSettings` or None (count steps only)."""
        self.schedule: Schedule | None = None
        self.max_norm: float | None = None
        self.max_value: float | None = None
        self.global_step = 0
        """Optimizer steps taken (plus the value restored by ``set_state``)."""
        if settings is not None:
            self.configure(settings)
        self._handles: list[Any] = []

    def configure(self, settings: Any) -> None:
        """Run ``settings``' schedule and clipping from the next step on (a
        :class:`~csrun.compiler.CompileSettings`; a learning rate of 0: the optimizer's own)."""
        lr = settings.learning_rate
        schedule = None if lr in (None, 0, 0.0) else build_schedule(lr)
        check_clipping(settings.max_gradient_norm, settings.max_gradient_value)
        self.schedule, self.max_norm, self.max_value = schedule, settings.max_gradient_norm, settings.max_gradient_value

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook ``optimizer.step()``: schedule + clipping before, step count after."""
        self._handles.append(optimizer.register_step_pre_hook(self._before))
        self._handles.append(optimizer.register_step_post_hook(self._after))

    def learning_rate(self) -> float | None:
        """The learning rate of the next step (None when the optimizer's own is used)."""
        return None if self.schedule is None else float(self.schedule(self.global_step))

    def _before(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        lr = self.learning_rate()
        if lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr
        if self.max_norm or self.max_value:
            grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            with torch.no_grad():
                clip_gradients(grads, max_norm=self.max_norm, max_value=self.max_value)

    def _after(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.global_step += 1
