"""What one training step asks of the device besides the forward: backward, update, fresh gradients.

A training loop does not always take an optimizer step per batch: a step may run the forward
alone, or accumulate gradients over several batches before ``optimizer.step()``, and it may
clip the gradients (``torch.nn.utils.clip_grad_norm_``) before the update. The driver tells the
device, with each batch, what the script did in that step (:class:`StepPlan`), and the engine
does exactly that: the device never applies an update, or a clipping, the script did not ask for.

The plan also carries what the script's host objects say about the step and the device keeps a
copy of (:mod:`csrun.driver.coherence`): each param group's hyperparameters the script set by
hand or a host LR scheduler computed (:attr:`StepPlan.hyperparameters`), and how its last
``zero_grad()`` cleared the gradients (:attr:`StepPlan.grads_to_none`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from csrun.program.errors import SpecError

HyperparameterValue = float | bool | tuple[float, ...]
"""A param group's hyperparameter as the wire carries it: a number, a flag, or a pair (``betas``)."""


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    """What a training step runs after its forward."""

    backward: bool = True
    """``loss.backward()`` ran: the step's gradients are added to those the device holds."""
    update: bool = True
    """``optimizer.step()`` ran: the held gradients are unscaled, clipped and applied, then
    cleared, and the global step advances."""
    clear_grads: bool = True
    """``zero_grad()`` ran since the last backward: held gradients are dropped before this backward."""
    grads_to_none: bool = True
    """That ``zero_grad()`` set the gradients to None (torch's default). False (``set_to_none=False``):
    a weight that had a gradient keeps a zero one, so an update this step did not reach still
    applies to it (momentum, Adam's moments, weight decay), as eager PyTorch does."""
    max_gradient_norm: float | None = None
    """``clip_grad_norm_(..., max_norm)`` before this update (the program's own clipping otherwise);
    the step then hands back the total norm as ``grad_norm``."""
    gradient_norm_type: float = 2.0
    """``clip_grad_norm_``'s ``norm_type`` (``inf`` for the largest element)."""
    max_gradient_value: float | None = None
    """``clip_grad_value_(..., clip_value)`` before this update."""
    hyperparameters: tuple[tuple[int, str, HyperparameterValue], ...] = ()
    """``(device group, key, value)``: this update's hyperparameters where the script's param
    group says otherwise than the compiled program (``lr`` set by hand or by a host scheduler,
    ``weight_decay``, ``momentum``, ``betas``, ...). A value stays the group's until changed again."""
    report_gradients: bool = False
    """Hand back the gradients this update applied (unscaled and clipped), ``grad:<weight>`` each,
    for the check against eager PyTorch (:mod:`csrun.driver.verify`)."""

    def to_json(self) -> dict[str, Any]:
        """The plan as the wire carries it (``inf`` as the string ``"inf"``: the wire's JSON is strict)."""
        raw = asdict(self)
        if math.isinf(self.gradient_norm_type):
            raw["gradient_norm_type"] = "inf"
        raw["hyperparameters"] = [[g, k, list(v) if isinstance(v, tuple) else v] for g, k, v in self.hyperparameters]
        return raw

    @staticmethod
    def from_json(raw: Any) -> "StepPlan":
        """A plan read off the wire (untrusted), or the default when absent; raises :class:`SpecError`."""
        if raw is None:
            return FULL_STEP
        if not isinstance(raw, dict) or set(raw) - _FIELDS:
            raise SpecError(f"a step plan takes the keys {sorted(_FIELDS)}, got {raw!r}")
        values = dict(raw)
        if values.get("gradient_norm_type") == "inf":
            values["gradient_norm_type"] = math.inf
        for key, value in values.items():
            if key in _FLAGS:
                if not isinstance(value, bool):
                    raise SpecError(f"step plan {key}: true or false, got {value!r}")
            elif key == "hyperparameters":
                values[key] = _hyperparameters(value)
            elif value is not None or key == "gradient_norm_type":
                values[key] = _positive(key, value)
        if values.get("max_gradient_norm") is not None and values.get("max_gradient_value") is not None:
            raise SpecError("step plan: max_gradient_norm and max_gradient_value together (one clipping per step)")
        return StepPlan(**values)


MAX_GROUPS = 4096
"""The most param groups a plan may name (a wire bound, far above any real optimizer's)."""


def _hyperparameters(raw: Any) -> tuple[tuple[int, str, HyperparameterValue], ...]:
    """Per-step hyperparameters read off the wire: ``[[group, key, value], ...]`` with a number, a
    flag or a list of numbers; raises :class:`SpecError` naming the bad entry."""
    if not isinstance(raw, list) or len(raw) > 64 * MAX_GROUPS:
        raise SpecError(f"step plan hyperparameters: a list of [group, key, value], got {type(raw).__name__}")
    out: list[tuple[int, str, HyperparameterValue]] = []
    for entry in raw:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], int)
                and not isinstance(entry[0], bool) and 0 <= entry[0] < MAX_GROUPS
                and isinstance(entry[1], str) and entry[1].isidentifier() and len(entry[1]) <= 64):
            raise SpecError(f"step plan hyperparameters: [group, key, value] with a group number and a key, "
                            f"got {entry!r}")
        group, key, value = entry
        out.append((group, key, _hyperparameter_value(key, value)))
    return tuple(out)


def _hyperparameter_value(key: str, value: Any) -> HyperparameterValue:
    if isinstance(value, bool):
        return value
    if isinstance(value, list):
        if not 1 <= len(value) <= 8:
            raise SpecError(f"step plan hyperparameter {key}: a list of 1 to 8 numbers, got {value!r}")
        return tuple(_finite(key, v) for v in value)
    return _finite(key, value)


def _finite(key: str, value: Any) -> float:
    """A finite float from the wire (a hyperparameter), else :class:`SpecError` naming it."""
    return _number(f"hyperparameter {key}", value, "a finite number", math.isfinite)


def _positive(key: str, value: Any) -> float:
    """A positive float (inf allowed) from the wire, else :class:`SpecError` naming it."""
    return _number(key, value, "a positive number", lambda n: n > 0)


def _number(what: str, value: Any, wanted: str, ok: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"step plan {what}: {wanted}, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        raise SpecError(f"step plan {what}: {value!r} is beyond a float") from None
    if not ok(number):
        raise SpecError(f"step plan {what}: {wanted}, got {value!r}")
    return number


_FLAGS = frozenset({"backward", "update", "clear_grads", "grads_to_none", "report_gradients"})
_FIELDS = _FLAGS | {"max_gradient_norm", "gradient_norm_type", "max_gradient_value", "hyperparameters"}


FULL_STEP = StepPlan()
"""forward, backward, update: the usual training step."""

FORWARD_ONLY = StepPlan(backward=False, update=False, clear_grads=False)
"""A training step that ran the model and nothing else: no gradients, no update."""
