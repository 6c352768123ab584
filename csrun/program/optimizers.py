"""The optimizer table: every optimizer type the system had, written once.

The params (``run/params.py``), the compiler (``compiler/optim.py``: params and torch optimizer
objects to the spec) and the torch optimizers the engine builds (``program/optimizer_classes.py``) all read this module; none of
them lists optimizer names, legacy keys or their defaults again
(``tests/program/test_training_semantics.py`` keeps it so, and checks that ``params_train.yaml``,
the compiled spec and the engine's optimizer agree for every type).

:data:`OPTIMIZERS`
    Legacy ``optimizer_type`` (lower case; the params accept any case) -> :class:`Optimizer`:
    its class name (``torch.optim`` has all but LAMB, which the engine implements), the params
    keys its update reads, its default epsilon, the state it keeps per weight (for the wafer
    memory budget) and whether the engine runs it with ``foreach``. :data:`NAMES` is the list
    in order, :data:`OptimizerType` the same list as a ``Literal`` for typed configs and
    :data:`TORCH_CLASSES` maps a ``torch.optim`` class name back to its legacy type.
:data:`HYPERPARAMETER_DEFAULTS`
    The default of each legacy hyperparameter key of the params ``optimizer:`` section (the
    typed :class:`csrun.program.optimizer_config.OptimizerConfig` declares its fields with them). They are
    torch's defaults for every type whose update reads the key, with one exception on purpose:
    ``weight_decay_rate`` is 0.0 for AdamW too (torch's is 0.01).
:func:`default_eps`
    The epsilon an optimizer type runs with when the params give none: torch's for its class,
    1e-6 for LAMB and for AdamW without bias correction (the legacy model zoo's), None for the
    types that have none (sgd, asgd, rprop) or their own form (adafactor: ``eps1``/``eps2``).
:func:`spec_hyperparameters`
    The one translation from a params ``optimizer:`` section (the typed
    :class:`~csrun.program.optimizer_config.OptimizerConfig` as a dict) to the hyperparameters of the compiled spec's optimizer: every key
    the type's update reads, at its value or its default (so the engine never falls back to a
    torch default that ``params_train.yaml`` does not show); a key the type does not read only
    when it is not at its default (the engine refuses it, e.g. ``correct_bias`` for sgd).
:func:`torch_hyperparameters`
    Legacy spellings to torch keyword names: ``beta1``/``beta2`` -> ``betas``;
    ``weight_decay_rate`` -> ``weight_decay``; ``epsilon`` -> ``eps``; ``use_nesterov`` ->
    ``nesterov``; ``eta1``/``eta2`` -> ``etas``; ``step_size_min``/``step_size_max`` ->
    ``step_sizes``; Adafactor ``eps1``/``eps2`` -> ``eps``, ``decay_rate`` -> ``beta2_decay``,
    ``clip_threshold`` -> ``d``. Pairs come out as lists (JSON); ``correct_bias`` and
    ``exclude_from_weight_decay`` stay (the engine reads them). Used by
    :func:`spec_hyperparameters` and by the engine for specs written with legacy keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping


@dataclass(frozen=True)
class Optimizer:
    """One optimizer type of the system."""

    name: str
    """The legacy ``optimizer_type``, lower case."""
    class_name: str
    """Its class: in ``torch.optim`` when :attr:`in_torch`, else the engine's own (``Lamb``)."""
    update_keys: tuple[str, ...]
    """The params keys (besides ``learning_rate``) that are hyperparameters of its update."""
    eps: float | None = None
    """Its default epsilon (see :func:`default_eps`)."""
    state_slots: float = 0.0
    """Parameter-sized state tensors it keeps per weight (adafactor: its factored moments, an estimate)."""
    slot_keys: tuple[str, ...] = ()
    """Hyperparameters that each add one state slot when set (momentum, amsgrad, centered)."""
    in_torch: bool = True
    decoupled_flag: bool = False
    """Its torch class takes ``decoupled_weight_decay`` (AdamW-style decay) as a flag and there is no
    class of its own for that form: the compiled spec keeps the flag (NAdam, RAdam)."""
    foreach: bool = False
    """The engine runs it with ``foreach=True``: its foreach and per-tensor updates are bit-for-bit
    the same (tests/emulator/test_optimizers.py checks it). adafactor, asgd, nadam and radam
    round differently in their foreach form and keep the per-tensor one."""


_ADAM_LIKE = ("beta1", "beta2", "eps", "weight_decay_rate")
_AMSGRAD = ("amsgrad",)

OPTIMIZERS: dict[str, Optimizer] = {o.name: o for o in (
    Optimizer("sgd", "SGD", ("momentum", "nesterov", "weight_decay_rate"), slot_keys=("momentum",), foreach=True),
    Optimizer("adam", "Adam", _ADAM_LIKE, 1e-8, 2.0, _AMSGRAD, foreach=True),
    Optimizer("adamw", "AdamW", (*_ADAM_LIKE, "correct_bias"), 1e-8, 2.0, _AMSGRAD, foreach=True),
    Optimizer("adamax", "Adamax", _ADAM_LIKE, 1e-8, 2.0, _AMSGRAD, foreach=True),
    Optimizer("adadelta", "Adadelta", ("rho", "eps", "weight_decay_rate"), 1e-6, 2.0, _AMSGRAD, foreach=True),
    Optimizer("adafactor", "Adafactor", ("weight_decay_rate",), state_slots=0.1),
    Optimizer("adagrad", "Adagrad", ("eps", "weight_decay_rate", "initial_accumulator_value"), 1e-10, 1.0,
              foreach=True),
    Optimizer("asgd", "ASGD", ("weight_decay_rate",), state_slots=1.0),
    Optimizer("lamb", "Lamb", _ADAM_LIKE, 1e-6, 2.0, _AMSGRAD, in_torch=False),
    Optimizer("radam", "RAdam", _ADAM_LIKE, 1e-8, 2.0, _AMSGRAD, decoupled_flag=True),
    Optimizer("nadam", "NAdam", _ADAM_LIKE, 1e-8, 2.0, _AMSGRAD, decoupled_flag=True),
    Optimizer("rmsprop", "RMSprop", ("alpha", "eps", "momentum", "centered", "weight_decay_rate"), 1e-8, 1.0,
              ("momentum", "centered"), foreach=True),
    Optimizer("rprop", "Rprop", (), state_slots=2.0, foreach=True),
)}
"""Legacy ``optimizer_type`` -> its :class:`Optimizer`, in the order the system listed them."""

NAMES: tuple[str, ...] = tuple(OPTIMIZERS)
"""The optimizer types, lower case."""

OptimizerType = Literal[NAMES]  # type: ignore[valid-type]
""":data:`NAMES` as a ``Literal`` (a typed config's ``optimizer_type``)."""

TORCH_CLASSES: dict[str, str] = {o.class_name: o.name for o in OPTIMIZERS.values() if o.in_torch}
"""``torch.optim`` class name -> legacy type (torch has no LAMB; LBFGS and SparseAdam have no legacy type)."""

NO_BIAS_CORRECTION_EPS = 1e-6
"""AdamW's default epsilon with ``correct_bias: false`` (the legacy model zoo's)."""

HYPERPARAMETER_DEFAULTS: dict[str, Any] = {
    "momentum": 0.0, "nesterov": False, "weight_decay_rate": 0.0, "beta1": 0.9, "beta2": 0.999,
    "correct_bias": True, "amsgrad": False, "rho": 0.9, "alpha": 0.99, "centered": False,
    "initial_accumulator_value": 0.0, "lr_decay": 0.0,
}
"""Legacy hyperparameter key -> its default (``eps``: :func:`default_eps`, per type)."""

DEFAULT_BETAS = (HYPERPARAMETER_DEFAULTS["beta1"], HYPERPARAMETER_DEFAULTS["beta2"])
"""``betas`` when neither ``beta1`` nor ``beta2`` is given."""

HYPERPARAMETER_KEYS = frozenset({*HYPERPARAMETER_DEFAULTS, "eps", "exclude_from_weight_decay"})
"""The keys of a params ``optimizer:`` section that :func:`spec_hyperparameters` translates (the
rest, learning rate, loss scaling, clipping, accumulation, are not the optimizer's)."""

_RENAMED = {"weight_decay_rate": "weight_decay", "epsilon": "eps", "use_nesterov": "nesterov"}
_PAIRS = {"betas": ("beta1", "beta2", DEFAULT_BETAS), "etas": ("eta1", "eta2", (0.5, 1.2)),
          "step_sizes": ("step_size_min", "step_size_max", (1e-6, 50.0))}
_FLOATS = frozenset({"momentum", "weight_decay", "eps", "rho", "alpha", "lr_decay", "initial_accumulator_value"})
_BOOLS = frozenset({"nesterov", "amsgrad", "centered", "correct_bias"})
_ADAFACTOR_FIXED = (("scale_parameter", False), ("relative_step", False), ("warmup_init", False))


def default_eps(optimizer_type: str, *, correct_bias: bool = True) -> float | None:
    """The epsilon ``optimizer_type`` runs with when the params give none (None: it has no epsilon)."""
    kind = optimizer_type.lower()
    if kind == "adamw" and not correct_bias:
        return NO_BIAS_CORRECTION_EPS
    entry = OPTIMIZERS.get(kind)
    return entry.eps if entry is not None else None


def torch_hyperparameters(optimizer_type: str, hyperparameters: Mapping[str, Any]) -> dict[str, Any]:
    """``hyperparameters`` with legacy keys under their torch keyword names (see the module doc).

    Scalars of known keys become float or bool; pairs become lists of floats. Raises
    :class:`ValueError` (a one-line reason) for an Adafactor form torch cannot run.
    """
    name = optimizer_type.lower()
    out = dict(hyperparameters)
    if name == "adafactor" and out.pop("beta1", None) is not None:
        raise ValueError("adafactor beta1 is not supported by torch.optim.Adafactor (leave it unset)")
    for pair, (first, second, default) in _PAIRS.items():
        if pair == "betas" and name == "adafactor":
            continue
        if first in out or second in out:
            out[pair] = [float(out.pop(first, default[0])), float(out.pop(second, default[1]))]
    for old, new in _RENAMED.items():
        if old in out:
            out[new] = out.pop(old)
    if name == "adafactor":
        if "eps1" in out or "eps2" in out:
            out["eps"] = [out.pop("eps1", None), float(out.pop("eps2", 1e-3))]
        if "decay_rate" in out:
            out["beta2_decay"] = out.pop("decay_rate")
        if "clip_threshold" in out:
            out["d"] = out.pop("clip_threshold")
        for key, ok in _ADAFACTOR_FIXED:
            if key in out and out.pop(key) != ok:
                raise ValueError(f"adafactor {key}: true is not supported by torch.optim.Adafactor; set it to false")
    for key, value in out.items():
        if key in _FLOATS and isinstance(value, (int, float, str)) and not isinstance(value, bool):
            out[key] = float(value)
        elif key in _BOOLS:
            out[key] = bool(value)
    if isinstance(out.get("exclude_from_weight_decay"), (list, tuple)):
        out["exclude_from_weight_decay"] = [str(x) for x in out["exclude_from_weight_decay"]]
    return out


def spec_hyperparameters(section: Mapping[str, Any]) -> dict[str, Any]:
    """The compiled spec's optimizer hyperparameters for a params ``optimizer:`` section.

    ``section["optimizer_type"]`` must be one of :data:`NAMES` (any case). Every key of the
    type's :attr:`Optimizer.update_keys` is passed, at its value or its default; another
    hyperparameter key only when it is set to something other than its default; None (and an
    empty ``exclude_from_weight_decay``) means unset. The result is :func:`torch_hyperparameters` of that (raises its ValueError).
    """
    kind = str(section["optimizer_type"]).lower()
    own = OPTIMIZERS[kind].update_keys
    chosen: dict[str, Any] = {}
    for key, value in section.items():
        if key not in HYPERPARAMETER_KEYS or value is None or (key == "exclude_from_weight_decay" and not value):
            continue
        if key not in own and key in HYPERPARAMETER_DEFAULTS and value == HYPERPARAMETER_DEFAULTS[key]:
            continue
        chosen[key] = value
    for key in own:
        if key in chosen:
            continue
        if key == "eps":
            chosen[key] = default_eps(kind, correct_bias=bool(chosen.get("correct_bias", True)))
        else:
            chosen[key] = HYPERPARAMETER_DEFAULTS[key]
    return torch_hyperparameters(kind, chosen)


def state_slots(optimizer_type: str, hyperparameters: Mapping[str, Any]) -> float:
    """Parameter-sized state tensors ``optimizer_type`` keeps per weight with these hyperparameters
    (2, Adam-like, for a type the table does not have)."""
    entry = OPTIMIZERS.get(optimizer_type.lower())
    if entry is None:
        return 2.0
    return entry.state_slots + sum(1.0 for key in entry.slot_keys if hyperparameters.get(key))
