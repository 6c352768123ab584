"""torch's LR schedulers as the device's schedule: a legacy ``learning_rate`` value, a pure function of the step.

On the system the learning rate was computed on the device from the global step. A torch
scheduler attached to the wrapped optimizer becomes the equivalent legacy ``learning_rate``
value (:mod:`csrun.program.schedules` runs it) with the same value as eager torch at every
step (closed forms in float64; torch's recursive updates agree to rounding):

===================== ======================================================================
torch                 legacy form
===================== ======================================================================
StepLR                ``Step`` (learning_rate, step_size, gamma)
MultiStepLR           ``MultiStep`` (learning_rate, gamma, milestones)
ExponentialLR         ``Exponential`` (decay_steps 1, decay_rate gamma)
LinearLR              ``Linear`` from base*start_factor to base*end_factor over total_iters
ConstantLR            ``PiecewiseConstant`` (base*factor until total_iters, then base)
CosineAnnealingLR     ``CosineAnnealing`` (t_max, eta_min)
PolynomialLR          ``Polynomial`` to 0 over total_iters with power
SequentialLR          a list of segments (each child's schedule, restarted at its milestone)
ChainedScheduler      ``Chained``: base x the product of each child's factor (children from the
                      multiplicative forms above: Step, MultiStep, Exponential, Linear,
                      Constant, Polynomial)
===================== ======================================================================

Anything else (``LambdaLR``, ``MultiplicativeLR``, ``OneCycleLR``, ``CyclicLR``,
``ReduceLROnPlateau``, a user subclass) runs Python or reads metrics on the host every step,
which the device cannot: :func:`check_scheduler` refuses it with the fix a script can apply.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim import lr_scheduler as torch_sched

from csrun.compiler.errors import LRSchedulerNotSupported

_MULTIPLICATIVE = (torch_sched.StepLR, torch_sched.MultiStepLR, torch_sched.ExponentialLR, torch_sched.LinearLR,
                   torch_sched.ConstantLR, torch_sched.PolynomialLR)
SUPPORTED: tuple[type, ...] = _MULTIPLICATIVE + (torch_sched.CosineAnnealingLR, torch_sched.SequentialLR,
                                                 torch_sched.ChainedScheduler)
"""The torch scheduler classes the device runs (exactly these classes, not subclasses)."""

FIX = ("use one of " + ", ".join(c.__name__ for c in SUPPORTED) + " (torch.optim.lr_scheduler), or combine them with "
       "SequentialLR / ChainedScheduler; a schedule that needs Python or metrics every step cannot run on the device")


def check_scheduler(scheduler: Any) -> None:
    """Refuse a scheduler the device cannot run (its class and children), naming it."""
    if type(scheduler) not in SUPPORTED:
        raise LRSchedulerNotSupported(f"{type(scheduler).__name__} runs Python on the host every step", fix=FIX)
    if isinstance(scheduler, torch_sched.ChainedScheduler):
        for child in scheduler._schedulers:
            if type(child) not in _MULTIPLICATIVE:
                raise LRSchedulerNotSupported(
                    f"ChainedScheduler of {type(child).__name__}: the device chains only the multiplicative schedulers",
                    fix="chain " + ", ".join(c.__name__ for c in _MULTIPLICATIVE) + "; or use SequentialLR")
            check_scheduler(child)
    elif isinstance(scheduler, torch_sched.SequentialLR):
        for child in scheduler._schedulers:
            check_scheduler(child)


def _base_lr(scheduler: Any, group: int) -> float:
    if isinstance(scheduler, (torch_sched.SequentialLR, torch_sched.ChainedScheduler)):
        bases = {_base_lr(child, group) for child in scheduler._schedulers}
        if len(bases) != 1:
            raise LRSchedulerNotSupported(f"{type(scheduler).__name__} over schedulers with different base learning "
                                          f"rates ({sorted(bases)})", fix="build every child on the same optimizer")
        return bases.pop()
    base = scheduler.base_lrs[group]
    return float(base.item() if isinstance(base, torch.Tensor) else base)


def learning_rates_of(scheduler: Any) -> list[Any]:
    """One legacy ``learning_rate`` value per param group of the scheduler's optimizer, each equal
    to ``scheduler`` at every step for that group (its own base learning rate)."""
    check_scheduler(scheduler)
    return [learning_rate_of(scheduler, group=i) for i in range(len(scheduler.optimizer.param_groups))]


def learning_rate_of(scheduler: Any, *, group: int = 0) -> Any:
    """The legacy ``learning_rate`` value equal to ``scheduler`` at every step for param group
    ``group`` (see the module table)."""
    check_scheduler(scheduler)
    base = _base_lr(scheduler, group)
    s = scheduler
    if isinstance(s, torch_sched.StepLR):
        return {"scheduler": "Step", "learning_rate": base, "step_size": int(s.step_size), "gamma": float(s.gamma)}
    if isinstance(s, torch_sched.MultiStepLR):
        milestones = sorted(int(m) for m, count in s.milestones.items() for _ in range(count))
        return {"scheduler": "MultiStep", "learning_rate": base, "gamma": float(s.gamma), "milestones": milestones}
    if isinstance(s, torch_sched.ExponentialLR):
        return {"scheduler": "Exponential", "initial_learning_rate": base, "decay_steps": 1,
                "decay_rate": float(s.gamma), "staircase": False}
    if isinstance(s, torch_sched.LinearLR):
        return {"scheduler": "Linear", "initial_learning_rate": base * float(s.start_factor),
                "end_learning_rate": base * float(s.end_factor), "steps": int(s.total_iters)}
    if isinstance(s, torch_sched.ConstantLR):
        return {"scheduler": "PiecewiseConstant", "values": [base * float(s.factor), base],
                "boundaries": [int(s.total_iters)]}
    if isinstance(s, torch_sched.PolynomialLR):
        return {"scheduler": "Polynomial", "initial_learning_rate": base, "end_learning_rate": 0.0,
                "steps": int(s.total_iters), "power": float(s.power)}
    if isinstance(s, torch_sched.CosineAnnealingLR):
        return {"scheduler": "CosineAnnealing", "learning_rate": base, "t_max": int(s.T_max), "eta_min": float(s.eta_min)}
    if isinstance(s, torch_sched.SequentialLR):
        milestones = [int(m) for m in s._milestones]
        segments: list[dict[str, Any]] = []
        starts = [0] + milestones
        for i, child in enumerate(s._schedulers):
            entry = dict(learning_rate_of(child, group=group))
            if i < len(milestones):
                entry["steps"] = starts[i + 1] - starts[i]
            segments.append(entry)
        return segments
    # ChainedScheduler
    return {"scheduler": "Chained", "learning_rate": base,
            "schedulers": [learning_rate_of(child, group=group) for child in s._schedulers]}
