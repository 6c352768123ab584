"""Learning-rate schedules: the legacy ``learning_rate`` value as a pure function of the global step.

On the system the learning rate was a tensor computed on the device from the global step, so a
schedule here is a plain function ``lr(step) -> float`` with no state: resuming at step N gives
the same value as running N steps. ``step`` is the global step *before* the update (the first
update uses ``lr(0)``).

Accepted forms of ``learning_rate`` (as in the params YAML, :data:`SCHEDULERS` case-insensitive):

- a number, or a numeric string such as ``"1e-4"`` (YAML reads those as strings): constant;
- a mapping with a ``scheduler`` key (see each class for its keys);
- a list of mappings, run one after another: every entry but the last needs ``steps`` (or
  ``decay_steps``), which is the length of its segment; each entry sees the step counted from
  the start of its segment (the legacy ``SequentialLR``).

Formulas follow the legacy model zoo's PyTorch schedulers (``modelzoo/common/pytorch/optim/
lr_scheduler.py``), which follow TensorFlow's; where they differ the docstring says which is
used. Values are computed in float64. Every rate, factor and power is a finite number >= 0, and
every length a whole number of 64 bits (a SpecError naming the key otherwise).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from csrun.program.errors import SpecError
from csrun.typed_config import FLOAT_LIMIT, INT_LIMITS

Schedule = Callable[[int], float]
"""A learning-rate schedule: global step (>= 0) to learning rate."""


def _num(params: Mapping[str, Any], key: str, where: str) -> float:
    value = params[key]
    try:
        if isinstance(value, bool):
            raise TypeError
        number = float(value)
    except OverflowError:
        number = math.inf
    except (TypeError, ValueError):
        raise SpecError(f"learning_rate: {where} key {key!r} must be a number, got {value!r}") from None
    return _rate(number, value, f"{where} key {key!r}")


def _rate(number: float, shown: Any, what: str) -> float:
    """``number`` as a float when it is a finite number >= 0 (every rate, factor and power of a schedule is one)."""
    if not 0 <= number <= FLOAT_LIMIT:  # NaN fails too
        raise SpecError(f"learning_rate: {what} must be a finite number >= 0, got {shown!r}")
    return float(number)


def _int(params: Mapping[str, Any], key: str, where: str, *, positive: bool = True) -> int:
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not value.is_integer()):
        raise SpecError(f"learning_rate: {where} key {key!r} must be an integer, got {value!r}")
    least = 1 if positive else 0
    if not least <= value <= INT_LIMITS[1]:
        raise SpecError(f"learning_rate: {where} key {key!r} must be a whole number from {least} to {INT_LIMITS[1]}, "
                        f"got {value!r}")
    return int(value)


def _bool(params: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(f"learning_rate: {where} key {key!r} must be true or false, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class Constant:
    """``lr = learning_rate``. Keys: learning_rate, steps (segment length in a list)."""

    learning_rate: float

    def __call__(self, step: int) -> float:
        return self.learning_rate


@dataclass(frozen=True, kw_only=True)
class Exponential:
    """``lr = initial_learning_rate * decay_rate ** (step / decay_steps)``; the exponent is floored
    when ``staircase`` (TF ``exponential_decay`` and the model zoo agree).
    Keys: initial_learning_rate, decay_steps, decay_rate, staircase (false)."""

    initial_learning_rate: float
    decay_steps: int
    decay_rate: float
    staircase: bool = False

    def __call__(self, step: int) -> float:
        power = step / self.decay_steps
        if self.staircase:
            power = math.floor(power)
        return self.initial_learning_rate * self.decay_rate**power


@dataclass(frozen=True, kw_only=True)
class PiecewiseConstant:
    """``lr = values[i]`` where ``i`` = number of boundaries ``<= step`` (the model zoo's form: the
    new value applies *at* the boundary step; TF's applies one step later).
    Keys: values (n+1 numbers), boundaries (n increasing integers)."""

    values: tuple[float, ...]
    boundaries: tuple[int, ...]

    def __call__(self, step: int) -> float:
        return self.values[bisect.bisect_right(self.boundaries, step)]


@dataclass(frozen=True, kw_only=True)
class Polynomial:
    """TF ``polynomial_decay``: ``lr = (init - end) * (1 - s / D) ** power + end`` with
    ``s = min(step, D)``, ``D = steps``; with ``cycle`` ``D = steps * ceil(step / steps)`` (1 at
    step 0) and ``s = step``. (The model zoo's cycle branch is masked by a ``step >= steps``
    clamp, so it never cycles; TF's documented behaviour is used.) ``Linear`` is power 1.
    Keys: initial_learning_rate, end_learning_rate, steps (or decay_steps), power (1.0), cycle (false)."""

    initial_learning_rate: float
    end_learning_rate: float
    steps: int
    power: float = 1.0
    cycle: bool = False

    def __call__(self, step: int) -> float:
        if self.cycle:
            multiplier = max(1, math.ceil(step / self.steps))
            decay_steps = self.steps * multiplier
            s = step
        else:
            decay_steps = self.steps
            s = min(step, self.steps)
        frac = 1.0 - s / decay_steps
        return (self.initial_learning_rate - self.end_learning_rate) * frac**self.power + self.end_learning_rate


@dataclass(frozen=True, kw_only=True)
class InverseExponentialTimeDecay:
    """Model zoo form of Keras ``InverseTimeDecay``:
    ``lr = init / (1 + decay_rate * a)``, ``a = step ** step_exponent / decay_steps`` (floored when
    ``staircase``). Keys: initial_learning_rate, decay_steps, decay_rate, step_exponent (1.0),
    staircase (false)."""

    initial_learning_rate: float
    decay_steps: int
    decay_rate: float
    step_exponent: float = 1.0
    staircase: bool = False

    def __call__(self, step: int) -> float:
        alpha = float(step) ** self.step_exponent / self.decay_steps
        if self.staircase:
            alpha = math.floor(alpha)
        return self.initial_learning_rate / (1.0 + self.decay_rate * alpha)


@dataclass(frozen=True, kw_only=True)
class CosineDecay:
    """Model zoo ``CosineDecayLR`` (Keras ``CosineDecay`` with an end value instead of alpha):
    ``lr = end + (init - end) * 0.5 * (1 + cos(pi * min(step, D) / D))``, ``D = decay_steps``.
    Keys: initial_learning_rate, end_learning_rate (0.0), decay_steps (or steps)."""

    initial_learning_rate: float
    end_learning_rate: float
    decay_steps: int

    def __call__(self, step: int) -> float:
        s = min(step, self.decay_steps)
        progress = 0.5 * (1.0 + math.cos(math.pi * s / self.decay_steps))
        return self.end_learning_rate + (self.initial_learning_rate - self.end_learning_rate) * progress


@dataclass(frozen=True, kw_only=True)
class CosineAnnealing:
    """Model zoo ``CosineAnnealingLR`` (the closed form of PyTorch's, no restarts, not clamped):
    ``lr = eta_min + (init - eta_min) * (1 + cos(pi * step / T_max)) / 2``.
    Keys: learning_rate (or initial_learning_rate), t_max (or T_max), eta_min (0.0)."""

    initial_learning_rate: float
    t_max: int
    eta_min: float = 0.0

    def __call__(self, step: int) -> float:
        a = (1.0 + math.cos(math.pi * step / self.t_max)) / 2.0
        return self.eta_min + (self.initial_learning_rate - self.eta_min) * a


@dataclass(frozen=True, kw_only=True)
class Step:
    """Model zoo ``StepLR``: ``lr = init * gamma ** floor(step / step_size)``.
    Keys: learning_rate (or initial_learning_rate), step_size, gamma."""

    initial_learning_rate: float
    step_size: int
    gamma: float

    def __call__(self, step: int) -> float:
        return self.initial_learning_rate * self.gamma ** (step // self.step_size)


@dataclass(frozen=True, kw_only=True)
class MultiStep:
    """Model zoo ``MultiStepLR``: ``lr = init * gamma ** k``, ``k`` = number of milestones ``<= step``.
    Keys: learning_rate (or initial_learning_rate), gamma, milestones (increasing integers)."""

    initial_learning_rate: float
    gamma: float
    milestones: tuple[int, ...]

    def __call__(self, step: int) -> float:
        return self.initial_learning_rate * self.gamma ** bisect.bisect_right(self.milestones, step)


@dataclass(frozen=True, kw_only=True)
class Sequential:
    """Segments run one after another; segment ``i`` starts at ``starts[i]`` and sees
    ``step - starts[i]`` (the model zoo's ``SequentialLR`` on a list of schedules)."""

    schedules: tuple[Schedule, ...]
    starts: tuple[int, ...]

    def __call__(self, step: int) -> float:
        i = bisect.bisect_right(self.starts, step) - 1
        return self.schedules[i](step - self.starts[i])


@dataclass(frozen=True, kw_only=True)
class Chained:
    """Schedules applied together, each as a factor of the base (torch's ``ChainedScheduler`` of
    multiplicative schedulers): ``lr = learning_rate * prod(s(step) / learning_rate)``.
    Keys: learning_rate (the base every child starts from), schedulers (a list of mappings)."""

    learning_rate: float
    schedules: tuple[Schedule, ...]

    def __call__(self, step: int) -> float:
        lr = self.learning_rate
        for s in self.schedules:
            lr *= s(step) / self.learning_rate
        return lr


_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # name: (required keys, optional keys) after aliasing
    "constant": (("learning_rate",), ("steps",)),
    "exponential": (("initial_learning_rate", "decay_steps", "decay_rate"), ("staircase", "steps")),
    "piecewiseconstant": (("values", "boundaries"), ("steps",)),
    "polynomial": (("initial_learning_rate", "end_learning_rate", "steps"), ("power", "cycle")),
    "linear": (("initial_learning_rate", "end_learning_rate", "steps"), ("cycle",)),
    "inverseexponentialtimedecay": (
        ("initial_learning_rate", "decay_steps", "decay_rate"),
        ("step_exponent", "staircase", "steps"),
    ),
    "cosinedecay": (("initial_learning_rate", "decay_steps"), ("end_learning_rate", "steps")),
    "cosineannealing": (("learning_rate", "t_max"), ("eta_min", "steps")),
    "step": (("learning_rate", "step_size", "gamma"), ("steps",)),
    "multistep": (("learning_rate", "gamma", "milestones"), ("steps",)),
    "chained": (("learning_rate", "schedulers"), ("steps",)),
}

SCHEDULERS = (
    "Constant", "Exponential", "PiecewiseConstant", "Polynomial", "Linear",
    "InverseExponentialTimeDecay", "CosineDecay", "CosineAnnealing", "Step", "MultiStep", "Chained",
)
"""The scheduler names the legacy ``learning_rate: {scheduler: ...}`` accepted."""

# key aliases: legacy spellings that mean the same value
_STEPS_KEY = {"polynomial": "steps", "linear": "steps"}


def _normalise(entry: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Fold aliases (steps/decay_steps/total_iters, learning_rate/initial_learning_rate, T_max/t_max)."""
    params = {k: v for k, v in entry.items() if k != "scheduler"}
    main = params.pop("main_scheduler", "SequentialLR")
    if str(main).lower() != "sequentiallr":
        raise SpecError(f"learning_rate: main_scheduler {main!r}: a list of schedules runs one after another "
                        f"(SequentialLR); give that or leave main_scheduler out")
    if "total_iters" in params:  # 2.x's name of the segment length
        total = params.pop("total_iters")
        if params.setdefault("steps", total) != total:
            raise SpecError(f"learning_rate: {name} has both total_iters and steps and they differ")
    if "T_max" in params and "t_max" not in params:
        params["t_max"] = params.pop("T_max")
    required, optional = _KEYS[name]
    keys = set(required) | set(optional)
    # steps <-> decay_steps are one value in the legacy code
    if "decay_steps" in params and "steps" in params and params["decay_steps"] != params["steps"]:
        raise SpecError(f"learning_rate: {name} has both steps and decay_steps and they differ")
    if "decay_steps" in keys and "steps" in params and "decay_steps" not in params:
        params["decay_steps"] = params["steps"]
    if "steps" in keys and "decay_steps" in params and "steps" not in params:
        params["steps"] = params["decay_steps"]
    if "decay_steps" in keys and "steps" not in keys:
        params.pop("steps", None)
    if "steps" in keys and "decay_steps" not in keys:
        params.pop("decay_steps", None)
    if "learning_rate" in keys and "initial_learning_rate" in params and "learning_rate" not in params:
        params["learning_rate"] = params.pop("initial_learning_rate")
    unknown = sorted(set(params) - keys - {"steps", "decay_steps"})
    if unknown:
        raise SpecError(
            f"learning_rate: unknown key(s) {unknown} for scheduler {entry['scheduler']!r}; "
            f"valid keys: scheduler, {', '.join(sorted(keys))}"
        )
    missing = [k for k in required if k not in params]
    if missing:
        raise SpecError(
            f"learning_rate: scheduler {entry['scheduler']!r} needs {missing}; "
            f"it takes: {', '.join(required)} (required), {', '.join(optional) or 'nothing else'} (optional)"
        )
    return params


def _one(entry: Mapping[str, Any]) -> tuple[Schedule, int | None]:
    """Build one scheduler mapping; returns the schedule and its segment length (or None)."""
    if not isinstance(entry, Mapping) or "scheduler" not in entry:
        raise SpecError(
            f"learning_rate: each schedule must be a mapping with a 'scheduler' key "
            f"(one of {', '.join(SCHEDULERS)}), got {entry!r}"
        )
    raw_name = entry["scheduler"]
    name = str(raw_name).lower()
    if name not in _KEYS:
        raise SpecError(
            f"learning_rate: unknown scheduler {raw_name!r}; valid choices: {', '.join(SCHEDULERS)} "
            f"(case-insensitive)"
        )
    p = _normalise(entry, name)
    w = f"scheduler {raw_name!r}"
    length = None
    if "steps" in p:
        length = _int(p, "steps", w)
    elif "decay_steps" in p:
        length = _int(p, "decay_steps", w)
    sched: Schedule
    if name == "constant":
        sched = Constant(learning_rate=_num(p, "learning_rate", w))
    elif name == "exponential":
        sched = Exponential(
            initial_learning_rate=_num(p, "initial_learning_rate", w),
            decay_steps=_int(p, "decay_steps", w),
            decay_rate=_num(p, "decay_rate", w),
            staircase=_bool(p, "staircase", w, False),
        )
    elif name == "piecewiseconstant":
        values, bounds = p["values"], p["boundaries"]
        if not isinstance(values, (list, tuple)) or not isinstance(bounds, (list, tuple)):
            raise SpecError(f"learning_rate: {w} values and boundaries must be lists")
        if len(values) != len(bounds) + 1:
            raise SpecError(
                f"learning_rate: {w} needs one more value than boundaries "
                f"(got {len(values)} values, {len(bounds)} boundaries)"
            )
        vals = tuple(_num({"values": v}, "values", w) for v in values)
        bnds = tuple(_int({"boundaries": b}, "boundaries", w, positive=False) for b in bounds)
        if list(bnds) != sorted(set(bnds)):
            raise SpecError(f"learning_rate: {w} boundaries must be strictly increasing, got {list(bnds)}")
        sched = PiecewiseConstant(values=vals, boundaries=bnds)
    elif name in ("polynomial", "linear"):
        power = 1.0 if name == "linear" else _num({"power": p.get("power", 1.0)}, "power", w)
        sched = Polynomial(
            initial_learning_rate=_num(p, "initial_learning_rate", w),
            end_learning_rate=_num(p, "end_learning_rate", w),
            steps=_int(p, "steps", w),
            power=power,
            cycle=_bool(p, "cycle", w, False),
        )
    elif name == "inverseexponentialtimedecay":
        sched = InverseExponentialTimeDecay(
            initial_learning_rate=_num(p, "initial_learning_rate", w),
            decay_steps=_int(p, "decay_steps", w),
            decay_rate=_num(p, "decay_rate", w),
            step_exponent=_num({"step_exponent": p.get("step_exponent", 1.0)}, "step_exponent", w),
            staircase=_bool(p, "staircase", w, False),
        )
    elif name == "cosinedecay":
        sched = CosineDecay(
            initial_learning_rate=_num(p, "initial_learning_rate", w),
            end_learning_rate=_num({"end_learning_rate": p.get("end_learning_rate", 0.0)}, "end_learning_rate", w),
            decay_steps=_int(p, "decay_steps", w),
        )
    elif name == "cosineannealing":
        sched = CosineAnnealing(
            initial_learning_rate=_num(p, "learning_rate", w),
            t_max=_int(p, "t_max", w),
            eta_min=_num({"eta_min": p.get("eta_min", 0.0)}, "eta_min", w),
        )
    elif name == "chained":
        children = p["schedulers"]
        if not isinstance(children, (list, tuple)) or not children:
            raise SpecError(f"learning_rate: {w} schedulers must be a non-empty list of scheduler mappings")
        base = _num(p, "learning_rate", w)
        if base == 0.0:
            raise SpecError(f"learning_rate: {w} learning_rate (the base) must not be 0")
        sched = Chained(learning_rate=base, schedules=tuple(_one(c)[0] for c in children))
    elif name == "step":
        sched = Step(
            initial_learning_rate=_num(p, "learning_rate", w),
            step_size=_int(p, "step_size", w),
            gamma=_num(p, "gamma", w),
        )
    else:  # multistep
        ms = p["milestones"]
        if not isinstance(ms, (list, tuple)):
            raise SpecError(f"learning_rate: {w} milestones must be a list of integers")
        milestones = tuple(_int({"milestones": m}, "milestones", w, positive=False) for m in ms)
        if list(milestones) != sorted(milestones):
            raise SpecError(f"learning_rate: {w} milestones must be increasing, got {list(milestones)}")
        sched = MultiStep(initial_learning_rate=_num(p, "learning_rate", w), gamma=_num(p, "gamma", w), milestones=milestones)
    return sched, length


def build_schedule(learning_rate: Any) -> Schedule:
    """Turn the legacy ``learning_rate`` value into a schedule; raises :class:`SpecError` naming
    the bad key and the valid choices."""
    if isinstance(learning_rate, bool):
        raise SpecError(f"learning_rate must be a number, a scheduler mapping or a list of them, got {learning_rate!r}")
    if isinstance(learning_rate, (int, float)):
        return Constant(learning_rate=_rate(learning_rate, learning_rate, "a constant"))
    if isinstance(learning_rate, str):
        try:
            number = float(learning_rate)
        except ValueError:
            raise SpecError(f"learning_rate: {learning_rate!r} is not a number") from None
        return Constant(learning_rate=_rate(number, learning_rate, "a constant"))
    if isinstance(learning_rate, Mapping):
        return _one(learning_rate)[0]
    if isinstance(learning_rate, (list, tuple)):
        if not learning_rate:
            raise SpecError("learning_rate: an empty list has no schedule")
        built = [_one(e) for e in learning_rate]
        if len(built) == 1:
            return built[0][0]
        starts = [0]
        for i, (_, length) in enumerate(built[:-1]):
            if length is None:
                raise SpecError(
                    f"learning_rate: entry {i} ({learning_rate[i].get('scheduler')!r}) needs 'steps' or "
                    f"'decay_steps': every schedule but the last in a list must say how long it runs"
                )
            starts.append(starts[-1] + length)
        return Sequential(schedules=tuple(s for s, _ in built), starts=tuple(starts))
    raise SpecError(
        f"learning_rate must be a number, a scheduler mapping or a list of them, got {type(learning_rate).__name__}"
    )
