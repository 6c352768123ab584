"""Which legacy ``optimizer:`` keys each optimizer's update reads, and the epsilon it defaults to.

One table for the runner (what ``params_train.yaml`` records and what it hands the compiler)
and the tests that keep the compiled spec and the engine's torch optimizer in step with it.

:data:`UPDATE_KEYS`
    The params keys (besides ``learning_rate``) that are hyperparameters of each optimizer
    type's update. The runner passes every one of them to the compiler, at its value or its
    documented default, so the engine never falls back to a torch default the params do not show
    (AdamW's torch default ``weight_decay=0.01`` against the params' ``weight_decay_rate: 0.0``,
    or an epsilon other than the one written). Keys outside an optimizer's list are left out when
    they are at their default (the compiler refuses, e.g., ``correct_bias`` for sgd).
:func:`default_eps`
    The epsilon an optimizer type runs with when the params give none: torch's for its class,
    1e-6 for LAMB and for AdamW without bias correction (the legacy model zoo's), None for the
    types that have none (sgd, asgd, rprop) or their own form (adafactor: ``eps1``/``eps2``).
"""

from __future__ import annotations

_ADAM_LIKE = ("beta1", "beta2", "eps", "weight_decay_rate")

UPDATE_KEYS: dict[str, tuple[str, ...]] = {
    "sgd": ("momentum", "nesterov", "weight_decay_rate"),
    "adam": _ADAM_LIKE,
    "adamw": (*_ADAM_LIKE, "correct_bias"),
    "adamax": _ADAM_LIKE,
    "nadam": _ADAM_LIKE,
    "radam": _ADAM_LIKE,
    "lamb": _ADAM_LIKE,
    "adadelta": ("rho", "eps", "weight_decay_rate"),
    "adagrad": ("eps", "weight_decay_rate", "initial_accumulator_value"),
    "asgd": ("weight_decay_rate",),
    "rmsprop": ("alpha", "eps", "momentum", "centered", "weight_decay_rate"),
    "rprop": (),
    "adafactor": ("weight_decay_rate",),
}
"""Legacy params keys that are hyperparameters of each optimizer type's update."""

_EPS = {"adam": 1e-8, "adamw": 1e-8, "adamax": 1e-8, "nadam": 1e-8, "radam": 1e-8, "rmsprop": 1e-8,
        "lamb": 1e-6, "adadelta": 1e-6, "adagrad": 1e-10}


def default_eps(optimizer_type: str, *, correct_bias: bool = True) -> float | None:
    """The epsilon ``optimizer_type`` runs with when the params give none (None: it has no epsilon)."""
    kind = optimizer_type.lower()
    if kind == "adamw" and not correct_bias:
        return 1e-6
    return _EPS.get(kind)
