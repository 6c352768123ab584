"""Compile settings: what the program spec needs besides the captured graph.

Built either by the user API (from a torch optimizer object and flags) or from the legacy
params: the typed sections (:func:`settings_from_config`, what the runner uses) or a params
mapping (:func:`settings_from_params`, which reads its ``optimizer:`` section through the same
typed config). :meth:`CompileSettings.program_spec` combines them
with the captured input schema into the :class:`~csrun.compiler.spec.ProgramSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from csrun.compiler.errors import ConfigError
from csrun.compiler.optim import optimizer_spec_from_config
from csrun.compiler.spec import LossScalingSpec, OptimizerSpec, ProgramSpec, TensorSpec
from csrun.program.spec import Precision
from csrun.program.execution import EXECUTION_STRATEGIES, PIPELINE, WEIGHT_STREAMING
from csrun.program.optimizer_config import OptimizerConfig, read_optimizer_section

RUN_MODES = ("train", "eval", "train_and_eval")
"""run.py ``--mode`` values."""


def precision_for(*, mixed_precision: bool, use_cbfloat16: bool = False) -> Precision:
    """The compute dtype: ``cbfloat16`` or ``float16`` under mixed precision, else ``float32``."""
    if not mixed_precision:
        return "float32"
    return "cbfloat16" if use_cbfloat16 else "float16"


@dataclass(frozen=True, kw_only=True)
class CompileSettings:
    """Everything a compile needs besides the model and a batch."""

    mode: str = "train"
    """The run mode: ``train``, ``eval`` (forward only) or ``train_and_eval`` (refused on the system)."""
    optimizer: OptimizerSpec | None = None
    """The optimizer (None for eval)."""
    learning_rate: Any = 0.0
    """The legacy ``learning_rate`` value: a number, a scheduler mapping or a list of them."""
    mixed_precision: bool = True
    """Float32 weights, 16-bit compute (the system's only training mode)."""
    use_cbfloat16: bool = False
    """``csconfig.use_cbfloat16``: cbfloat16 instead of float16 compute."""
    loss_scaling: LossScalingSpec = field(default_factory=LossScalingSpec)
    """Fixed or dynamic loss scaling."""
    max_gradient_norm: float | None = None
    """Clip the global gradient norm to this (None: no clipping)."""
    max_gradient_value: float | None = None
    """Clip each gradient element to ±this (None: no clipping)."""
    grad_accum_steps: int = 1
    """Gradient accumulation: above 1 it is refused pipelined (as the system did) and accepted
    in weight-streaming mode (as the system's weight-streaming runs accepted it)."""
    execution_strategy: str = PIPELINE
    """``pipeline`` or ``weight_streaming`` (:mod:`csrun.program.execution`): which placement, fit
    rule and estimate the compile uses; the program and its numerics are the same."""

    def __post_init__(self) -> None:
        if self.execution_strategy not in EXECUTION_STRATEGIES:
            raise ConfigError(f"execution_strategy {self.execution_strategy!r} is not one of "
                              f"{', '.join(EXECUTION_STRATEGIES)}",
                              fix=f"use --execution_strategy {PIPELINE} or --execution_strategy {WEIGHT_STREAMING}")

    @property
    def streaming(self) -> bool:
        """True in weight-streaming mode."""
        return self.execution_strategy == WEIGHT_STREAMING

    @property
    def precision(self) -> Precision:
        """The compute dtype name (see :func:`precision_for`)."""
        return precision_for(mixed_precision=self.mixed_precision, use_cbfloat16=self.use_cbfloat16)

    @property
    def program_mode(self) -> str:
        """``train`` or ``eval``: the kind of program compiled (train_and_eval compiles train)."""
        return "eval" if self.mode == "eval" else "train"

    def program_spec(self, *, inputs: tuple[TensorSpec, ...], input_tree: str, outputs: tuple[str, ...]) -> ProgramSpec:
        """The :class:`ProgramSpec` for a captured step with this input schema."""
        train = self.program_mode == "train"
        return ProgramSpec(
            mode=self.program_mode, inputs=inputs, input_tree=input_tree,
            optimizer=self.optimizer if train else None,
            learning_rate=self.learning_rate if train else 0.0,
            precision=self.precision,
            loss_scaling=self.loss_scaling, max_gradient_norm=self.max_gradient_norm,
            max_gradient_value=self.max_gradient_value, outputs=outputs)


def loss_scaling_from_config(config: OptimizerConfig) -> LossScalingSpec:
    """Loss scaling from the optimizer section (``loss_scaling_factor``: a number or ``"dynamic"``)."""
    factor = config.loss_scaling_factor
    return LossScalingSpec(
        factor="dynamic" if factor == "dynamic" else float(factor),
        initial_loss_scale=float(config.initial_loss_scale), steps_per_increase=int(config.steps_per_increase),
        min_loss_scale=float(config.min_loss_scale), max_loss_scale=float(config.max_loss_scale))


def _float_or_none(value: float | None) -> float | None:
    return None if value is None else float(value)


def settings_from_config(optimizer: OptimizerConfig | None, *, mode: str = "train", mixed_precision: bool,
                         use_cbfloat16: bool = False, execution_strategy: str = PIPELINE) -> CompileSettings:
    """Compile settings from the typed params: the one translation of an ``optimizer:`` section.

    ``optimizer`` is the checked section (None: no section, allowed for ``mode="eval"``);
    the rest are ``model.mixed_precision``, ``csconfig.use_cbfloat16`` and
    ``runconfig.execution_strategy``. ``mode`` is run.py's ``--mode``.
    """
    if mode not in RUN_MODES:
        raise ConfigError(f"mode {mode!r} is not one of {', '.join(RUN_MODES)}", fix="pass --mode train or --mode eval")
    if optimizer is None:
        if mode != "eval":
            raise ConfigError("params has no optimizer section",
                              fix="add optimizer: {optimizer_type: sgd, learning_rate: 0.001}")
        return CompileSettings(mode=mode, mixed_precision=mixed_precision, use_cbfloat16=use_cbfloat16,
                               execution_strategy=execution_strategy)
    return CompileSettings(
        mode=mode, optimizer=optimizer_spec_from_config(optimizer), learning_rate=optimizer.learning_rate,
        mixed_precision=mixed_precision, use_cbfloat16=use_cbfloat16,
        loss_scaling=loss_scaling_from_config(optimizer),
        max_gradient_norm=_float_or_none(optimizer.max_gradient_norm),
        max_gradient_value=_float_or_none(optimizer.max_gradient_value),
        grad_accum_steps=optimizer.grad_accum_steps, execution_strategy=execution_strategy)


def settings_from_params(params: Mapping[str, Any], *, mode: str = "train") -> CompileSettings:
    """Compile settings from a legacy params mapping (the YAML, already loaded; for scripts and benchmarks).

    The ``optimizer`` section is read as run.py reads it
    (:func:`csrun.program.optimizer_config.read_optimizer_section`); besides it,
    ``model.mixed_precision`` (required), ``csconfig.use_cbfloat16`` (``model.use_cbfloat16``
    also accepted) and ``runconfig.execution_strategy`` (default ``pipeline``). Then
    :func:`settings_from_config`.
    """
    model = params.get("model") or {}
    if "mixed_precision" not in model:
        raise ConfigError("params model.mixed_precision is required",
                          fix="set model.mixed_precision: True (the system trains in mixed precision)")
    csconfig = params.get("csconfig") or {}
    section = params.get("optimizer")
    return settings_from_config(
        read_optimizer_section(section) if section else None, mode=mode,
        mixed_precision=bool(model["mixed_precision"]),
        use_cbfloat16=bool(csconfig.get("use_cbfloat16", model.get("use_cbfloat16", False))),
        execution_strategy=str((params.get("runconfig") or {}).get("execution_strategy") or PIPELINE))
