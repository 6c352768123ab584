"""torch LR schedulers become the device's schedule: the same value as eager torch at every step."""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch
from torch.optim import lr_scheduler as S

from csrun.compiler.errors import LRSchedulerNotSupported
from csrun.compiler.lr_schedulers import check_scheduler, learning_rate_of
from csrun.program.schedules import build_schedule

from .helpers import LR_SCHEDULERS

BASE = 0.1
STEPS = 50


def _opt() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=BASE, momentum=0.9)


@pytest.mark.parametrize("name", sorted(LR_SCHEDULERS))
def test_device_schedule_equals_eager_torch_at_every_step(name: str) -> None:
    opt = _opt()
    scheduler = LR_SCHEDULERS[name](opt)
    schedule = build_schedule(learning_rate_of(scheduler))
    eager = []
    for _ in range(STEPS):
        eager.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    device = [schedule(step) for step in range(STEPS)]
    for step, (e, d) in enumerate(zip(eager, device)):
        assert math.isclose(e, d, rel_tol=1e-9, abs_tol=1e-15), f"{name} step {step}: eager {e} device {d}"


@pytest.mark.parametrize("make", [
    lambda o: S.LambdaLR(o, lambda step: 0.9**step),
    lambda o: S.ReduceLROnPlateau(o),
    lambda o: S.OneCycleLR(o, max_lr=1.0, total_steps=10),
    lambda o: S.ChainedScheduler([S.CosineAnnealingLR(o, T_max=5), S.StepLR(o, 2)]),
])
def test_schedulers_the_device_cannot_run_are_refused_with_a_fix(make: Callable[[Any], Any]) -> None:
    with pytest.raises(LRSchedulerNotSupported) as info:
        check_scheduler(make(_opt()))
    assert "StepLR" in info.value.render() or "chain" in info.value.render()
