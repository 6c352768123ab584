"""What one training step asks of the device besides the forward: backward, update, fresh gradients.

A training loop does not always take an optimizer step per batch: a step may run the forward
alone, or accumulate gradients over several batches before ``optimizer.step()``, and it may
clip the gradients (``torch.nn.utils.clip_grad_norm_``) before the update. The driver tells the
device, with each batch, what the script did in that step (:class:`StepPlan`), and the engine
does exactly that: the device never applies an update, or a clipping, the script did not ask for.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from csrun.program.errors import SpecError


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
    max_gradient_norm: float | None = None
    """``clip_grad_norm_(..., max_norm)`` before this update (the program's own clipping otherwise);
    the step then hands back the total norm as ``grad_norm``."""
    gradient_norm_type: float = 2.0
    """``clip_grad_norm_``'s ``norm_type`` (``inf`` for the largest element)."""
    max_gradient_value: float | None = None
    """``clip_grad_value_(..., clip_value)`` before this update."""

    def to_json(self) -> dict[str, Any]:
        """The plan as the wire carries it (``inf`` as the string ``"inf"``: the wire's JSON is strict)."""
        raw = asdict(self)
        if math.isinf(self.gradient_norm_type):
            raw["gradient_norm_type"] = "inf"
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
            elif value is not None or key == "gradient_norm_type":
                values[key] = _positive(key, value)
        if values.get("max_gradient_norm") is not None and values.get("max_gradient_value") is not None:
            raise SpecError("step plan: max_gradient_norm and max_gradient_value together (one clipping per step)")
        return StepPlan(**values)


def _positive(key: str, value: Any) -> float:
    """A positive float (inf allowed) from the wire, else :class:`SpecError` naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"step plan {key}: a positive number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        raise SpecError(f"step plan {key}: {value!r} is beyond a float") from None
    if not number > 0:
        raise SpecError(f"step plan {key}: a positive number, got {value!r}")
    return number


_FLAGS = frozenset({"backward", "update", "clear_grads"})
_FIELDS = _FLAGS | {"max_gradient_norm", "gradient_norm_type", "max_gradient_value"}


FULL_STEP = StepPlan()
"""forward, backward, update: the usual training step."""

FORWARD_ONLY = StepPlan(backward=False, update=False, clear_grads=False)
"""A training step that ran the model and nothing else: no gradients, no update."""
