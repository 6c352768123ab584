"""The params ``optimizer:`` section as a typed dataclass: the one reader of that section.

:class:`OptimizerConfig` is what ``run.py``'s params (:mod:`csrun.run.params`), the compiler's
dict API (:func:`csrun.compiler.settings.settings_from_params`) and
:func:`csrun.compiler.optim.optimizer_spec_from_params` all read a section through, so a key
one of them accepts the others accept too, with the same defaults (:mod:`csrun.program.optimizers`,
:mod:`csrun.program.loss_scaling`) and the same errors (:class:`~csrun.errors.ConfigError`,
exit 2, naming the key). :func:`read_optimizer_section` builds and checks one from a mapping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

from csrun.program.errors import SpecError
from csrun.program.loss_scaling import INITIAL_LOSS_SCALE, MAX_LOSS_SCALE, MIN_LOSS_SCALE, STEPS_PER_INCREASE
from csrun.program.optimizers import HYPERPARAMETER_DEFAULTS as OPT, NAMES, OptimizerType, default_eps
from csrun.program.schedules import build_schedule
from csrun.typed_config import ConfigError, check_fields, from_mapping, required, setting

__all__ = ["OptimizerConfig", "check_learning_rate", "read_optimizer_section"]


@dataclass(kw_only=True)
class OptimizerConfig:
    """``optimizer``: the optimizer, its schedule, loss scaling and clipping (run on the device)."""

    optimizer_type: OptimizerType = required("one of " + ", ".join(NAMES) + " (any case)")
    learning_rate: float | dict[str, Any] | list[dict[str, Any]] = required(
        "a number, a {scheduler: ...} mapping, or a list of them", min=0)
    momentum: float = setting(OPT["momentum"], "SGD / RMSprop momentum", min=0)
    nesterov: bool = setting(OPT["nesterov"], "SGD Nesterov momentum")
    weight_decay_rate: float = setting(OPT["weight_decay_rate"], "weight decay", min=0)
    beta1: float = setting(OPT["beta1"], "Adam-family first-moment decay", min=0, below=1)
    beta2: float = setting(OPT["beta2"], "Adam-family second-moment decay", min=0, below=1)
    eps: float | None = setting(None, "the optimizer's epsilon (default: its own, see csrun.program.optimizers; "
                                      "params_train.yaml records the value that runs)", min=0)
    correct_bias: bool = setting(OPT["correct_bias"], "Adam/AdamW/LAMB bias correction")
    amsgrad: bool = setting(OPT["amsgrad"], "Adam-family AMSGrad variant (one more state tensor per weight)")
    exclude_from_weight_decay: list[str] = setting([], "parameter-name substrings that get no weight decay "
                                                       "(e.g. bias, LayerNorm)")
    rho: float = setting(OPT["rho"], "Adadelta decay", min=0, max=1)
    alpha: float = setting(OPT["alpha"], "RMSprop smoothing", min=0)
    centered: bool = setting(OPT["centered"], "RMSprop centered")
    initial_accumulator_value: float = setting(OPT["initial_accumulator_value"], "Adagrad initial accumulator", min=0)
    lr_decay: float = setting(OPT["lr_decay"], "Adagrad learning-rate decay", min=0)
    loss_scaling_factor: float | Literal["dynamic"] = setting(1.0, "a number, or 'dynamic'", above=0)
    initial_loss_scale: float = setting(INITIAL_LOSS_SCALE, "dynamic scaling: the first scale", above=0)
    steps_per_increase: int = setting(STEPS_PER_INCREASE, "dynamic scaling: good steps before the scale doubles", min=1)
    min_loss_scale: float = setting(MIN_LOSS_SCALE, "dynamic scaling: lower bound", above=0)
    max_loss_scale: float = setting(MAX_LOSS_SCALE, "dynamic scaling: upper bound", above=0)
    max_gradient_norm: float | None = setting(None, "clip the global gradient norm to this", above=0)
    max_gradient_value: float | None = setting(None, "clip every gradient element to +-this", above=0)
    grad_accum_steps: int = setting(1, "gradient accumulation (CPU, and weight-streaming mode on the system; "
                                        "refused pipelined on the system)", min=1)

    def check(self, path: str = "optimizer") -> None:
        """Refuse impossible values, naming the keys; fill in the epsilon the optimizer runs with."""
        check_fields(self, path)
        if self.eps is None:
            self.eps = default_eps(self.optimizer_type, correct_bias=self.correct_bias)
        if self.max_gradient_norm is not None and self.max_gradient_value is not None:
            raise ConfigError(f"{path}: give one of max_gradient_norm and max_gradient_value, not both")
        if not 0 < self.min_loss_scale <= self.initial_loss_scale <= self.max_loss_scale:
            raise ConfigError(f"{path}: need 0 < min_loss_scale <= initial_loss_scale <= max_loss_scale")
        check_learning_rate(self.learning_rate, path)


def check_learning_rate(learning_rate: Any, path: str = "optimizer") -> None:
    """Refuse a ``learning_rate`` the schedule builder cannot run (the engine's own rules)."""
    try:
        build_schedule(learning_rate)
    except SpecError as exc:
        raise ConfigError(f"{path}.{exc}") from None


def read_optimizer_section(section: Mapping[str, Any], path: str = "optimizer") -> OptimizerConfig:
    """A checked :class:`OptimizerConfig` from a YAML mapping (unknown keys, wrong types and
    impossible values are :class:`~csrun.errors.ConfigError` naming ``path.key``)."""
    if not isinstance(section, Mapping):
        raise ConfigError(f"{path}: must be a mapping")
    config = from_mapping(OptimizerConfig, section, path)
    config.check(path)
    return config
