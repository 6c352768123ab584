"""``cstorch.optim.lr_scheduler``: learning rates the device computes from the global step.

On the system the learning rate is a function of the global step computed on the device, not
a Python object stepped on the host. So is every scheduler here: :class:`LRScheduler` holds a
legacy ``learning_rate`` value (run by :func:`csrun.program.schedules.build_schedule`, the
function the engine runs) and the learning rate of the next optimizer step is
``schedule(global_step)``. Calling ``step()`` is allowed and changes nothing (a loop that
never calls it gets the same rates); ``get_last_lr()`` is the rate of the next step.

The schedule is one of the process's :class:`~csrun.pytorch.backends.TrainingSettings`, handed
to the backend (:meth:`csrun.torch.backend.Backend.apply_settings`); the last scheduler built
wins. On the device it goes into the compiled program; on the CPU the eager backend's
:class:`~csrun.torch.rules.TrainingRules` set each group's ``lr`` before every step, as they do
for a cbtorch run's ``learning_rate``.

``state_dict()`` is ``{"global_step": N}``, the runner's ``lr_scheduler`` checkpoint entry;
``load_state_dict`` restores the global step (``cbtorch.set_state``), so a resumed run
continues the schedule, and a runner or cbtorch checkpoint's entry loads here.

The classes (arguments as in cstorch 2.x; each becomes the legacy form named):
:class:`ConstantLR` (``Constant``), :class:`LinearLR` (``Linear``), :class:`PolynomialLR`
(``Polynomial``), :class:`ExponentialLR` (``Exponential``),
:class:`InverseExponentialTimeDecayLR`, :class:`CosineDecayLR`, :class:`CosineAnnealingLR`,
:class:`StepLR` (``Step``), :class:`MultiStepLR` (``MultiStep``), :class:`PiecewiseConstantLR`
(``PiecewiseConstant``: ``learning_rates`` with one more value than ``milestones``) and
:class:`SequentialLR` (a list of its children's forms, each running for its segment).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

import csrun.torch as cbtorch
from csrun.program.schedules import Schedule, build_schedule
from csrun.errors import UserError
from csrun.pytorch.backends import update_settings

class LRSchedulerError(UserError):
    """A scheduler argument that does not fit."""


class LRScheduler:
    """A learning-rate schedule of the global step on one optimizer (see the module manual)."""

    def __init__(self, optimizer: torch.optim.Optimizer, learning_rate: Any) -> None:
        """``learning_rate``: the legacy form (a number, a ``{scheduler: ...}`` mapping, a list)."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise LRSchedulerError(f"{type(self).__name__} needs the optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.learning_rate = learning_rate
        """The legacy ``learning_rate`` value this scheduler is."""
        self.schedule: Schedule = build_schedule(learning_rate)
        update_settings(learning_rate=learning_rate)  # the backend runs it from now on
        lr = self.get_last_lr()[0]
        for group in optimizer.param_groups:  # the next step's rate, shown at once
            group["lr"] = lr

    @property
    def last_epoch(self) -> int:
        """Optimizer steps taken (the global step)."""
        return cbtorch.global_step()

    def get_last_lr(self) -> list[float]:
        """The learning rate of the next optimizer step, once per param group."""
        lr = float(self.schedule(cbtorch.global_step()))
        return [lr] * len(self.optimizer.param_groups)

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: the rate follows the global step (kept so 2.x loops run unchanged)."""

    def state_dict(self) -> dict[str, Any]:
        """``{"global_step": N}`` (the runner's ``lr_scheduler`` entry)."""
        return {"global_step": cbtorch.global_step()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the global step from :meth:`state_dict` (or a runner checkpoint's ``lr_scheduler``)."""
        if not isinstance(state, Mapping) or "global_step" not in state:
            got = sorted(map(str, state)) if isinstance(state, Mapping) else type(state).__name__
            raise LRSchedulerError(f"{type(self).__name__}.load_state_dict needs {{'global_step': N}}, got {got}")
        current = cbtorch.get_state()
        cbtorch.set_state({**current, "global_step": state["global_step"]})


def _steps(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LRSchedulerError(f"{name}={value!r}: give a positive number of steps")
    return value


class ConstantLR(LRScheduler):
    """``learning_rate`` at every step (``total_iters``: the segment length inside a SequentialLR)."""

    def __init__(self, optimizer: torch.optim.Optimizer, learning_rate: float, total_iters: int | None = None) -> None:
        form: dict[str, Any] = {"scheduler": "Constant", "learning_rate": learning_rate}
        if total_iters is not None:
            form["steps"] = _steps("total_iters", total_iters)
        super().__init__(optimizer, form)


class PolynomialLR(LRScheduler):
    """From ``initial_learning_rate`` to ``end_learning_rate`` over ``total_iters`` steps along ``power``."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, end_learning_rate: float,
                 total_iters: int, power: float = 1.0, cycle: bool = False) -> None:
        super().__init__(optimizer, {"scheduler": "Polynomial", "initial_learning_rate": initial_learning_rate,
                                     "end_learning_rate": end_learning_rate, "steps": _steps("total_iters", total_iters),
                                     "power": power, "cycle": cycle})


class LinearLR(LRScheduler):
    """From ``initial_learning_rate`` to ``end_learning_rate`` linearly over ``total_iters`` steps."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, end_learning_rate: float,
                 total_iters: int, cycle: bool = False) -> None:
        super().__init__(optimizer, {"scheduler": "Linear", "initial_learning_rate": initial_learning_rate,
                                     "end_learning_rate": end_learning_rate, "steps": _steps("total_iters", total_iters),
                                     "cycle": cycle})


class ExponentialLR(LRScheduler):
    """``initial_learning_rate * decay_rate ** (step / total_iters)`` (floored with ``staircase``)."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, total_iters: int,
                 decay_rate: float, staircase: bool = False) -> None:
        super().__init__(optimizer, {"scheduler": "Exponential", "initial_learning_rate": initial_learning_rate,
                                     "decay_steps": _steps("total_iters", total_iters), "decay_rate": decay_rate,
                                     "staircase": staircase})


class InverseExponentialTimeDecayLR(LRScheduler):
    """``initial_learning_rate / (1 + decay_rate * (step / total_iters) ** step_exponent)``."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, step_exponent: float,
                 total_iters: int, decay_rate: float, staircase: bool = False) -> None:
        super().__init__(optimizer, {"scheduler": "InverseExponentialTimeDecay",
                                     "initial_learning_rate": initial_learning_rate, "step_exponent": step_exponent,
                                     "decay_steps": _steps("total_iters", total_iters), "decay_rate": decay_rate,
                                     "staircase": staircase})


class CosineDecayLR(LRScheduler):
    """Half a cosine from ``initial_learning_rate`` to ``end_learning_rate`` over ``total_iters`` steps."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, end_learning_rate: float,
                 total_iters: int) -> None:
        super().__init__(optimizer, {"scheduler": "CosineDecay", "initial_learning_rate": initial_learning_rate,
                                     "end_learning_rate": end_learning_rate,
                                     "decay_steps": _steps("total_iters", total_iters)})


class CosineAnnealingLR(LRScheduler):
    """torch's cosine annealing: period ``2 * T_max``, from ``initial_learning_rate`` down to ``eta_min``."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, T_max: int,  # noqa: N803
                 eta_min: float = 0.0) -> None:
        super().__init__(optimizer, {"scheduler": "CosineAnnealing", "learning_rate": initial_learning_rate,
                                     "t_max": _steps("T_max", T_max), "eta_min": eta_min})


class StepLR(LRScheduler):
    """``initial_learning_rate * gamma ** (step // step_size)``."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, step_size: int,
                 gamma: float) -> None:
        super().__init__(optimizer, {"scheduler": "Step", "learning_rate": initial_learning_rate,
                                     "step_size": _steps("step_size", step_size), "gamma": gamma})


class MultiStepLR(LRScheduler):
    """``initial_learning_rate`` times ``gamma`` once more at each of ``milestones``."""

    def __init__(self, optimizer: torch.optim.Optimizer, initial_learning_rate: float, gamma: float,
                 milestones: Sequence[int]) -> None:
        super().__init__(optimizer, {"scheduler": "MultiStep", "learning_rate": initial_learning_rate,
                                     "gamma": gamma, "milestones": list(milestones)})


class PiecewiseConstantLR(LRScheduler):
    """``learning_rates[i]`` from ``milestones[i-1]`` on (one more rate than milestones)."""

    def __init__(self, optimizer: torch.optim.Optimizer, learning_rates: Sequence[float],
                 milestones: Sequence[int]) -> None:
        super().__init__(optimizer, {"scheduler": "PiecewiseConstant", "values": list(learning_rates),
                                     "boundaries": list(milestones)})


class SequentialLR(LRScheduler):
    """``schedulers`` one after another: the i-th runs until ``milestones[i]`` (counted from its start)."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedulers: Sequence[LRScheduler],
                 milestones: Sequence[int]) -> None:
        children = list(schedulers)
        bounds = list(milestones)
        if not children or len(bounds) != len(children) - 1 or not all(isinstance(c, LRScheduler) for c in children):
            raise LRSchedulerError(f"SequentialLR needs cstorch schedulers and one milestone fewer than them, got "
                                   f"{len(children)} scheduler(s) and milestones {bounds}")
        if bounds != sorted(set(bounds)) or (bounds and bounds[0] < 1):
            raise LRSchedulerError(f"SequentialLR milestones={bounds}: give increasing step numbers above 0")
        forms: list[Any] = []
        start = 0
        for i, child in enumerate(children):
            if not isinstance(child.learning_rate, Mapping):
                raise LRSchedulerError(f"SequentialLR: scheduler {i} ({type(child).__name__}) is itself a sequence; "
                                       f"give its parts directly")
            form = dict(child.learning_rate)
            if i < len(bounds):
                length = bounds[i] - start
                start = bounds[i]
                given = form.get("steps", form.get("decay_steps"))
                if given is not None and given != length:
                    raise LRSchedulerError(f"SequentialLR: scheduler {i} ({type(child).__name__}) runs {given} steps "
                                           f"but its segment is {length} (milestone {bounds[i]}): make them equal")
                form.setdefault("steps", length)
            forms.append(form)
        super().__init__(optimizer, forms)


__all__ = ["LRScheduler", "LRSchedulerError", "ConstantLR", "LinearLR", "PolynomialLR", "ExponentialLR",
           "InverseExponentialTimeDecayLR", "CosineDecayLR", "CosineAnnealingLR", "StepLR", "MultiStepLR",
           "PiecewiseConstantLR", "SequentialLR"]
