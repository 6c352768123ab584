"""The params YAML of the model zoo, as typed keyword-only dataclasses, one per section.

A params file has the sections ``runconfig``, ``optimizer``, ``model``, ``train_input``,
``eval_input`` and ``csconfig`` (``--config NAME`` picks one top-level key of a file that
holds several such sets). ``model`` (and, where a model has processor fields, the inputs)
are the model's own dataclasses, subclasses of :class:`ModelConfig` and :class:`InputConfig`.
The input section is modelled once, in :mod:`csrun.data.config`: :class:`InputConfig` here is
that class, so a section reads the same through the runner and through the data loader; the
``optimizer`` section likewise is :class:`csrun.program.optimizer_config.OptimizerConfig`, the
class the compiler reads a section through.
Every section is read by :mod:`csrun.typed_config` (fields declared with :func:`doc` /
:func:`required`, bounds included); unknown keys, wrong types and impossible combinations are
:class:`~csrun.errors.ConfigError` (exit 2) naming the YAML path of the bad key and the valid
choices.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal


from csrun.data.config import InputConfig
from csrun.program.optimizer_config import OptimizerConfig
from csrun.program.optimizers import OptimizerType
from csrun.yaml_file import read_yaml as read_yaml_file
from csrun.typed_config import (
    ConfigError,
    check_fields,
    from_mapping,
    required,
    setting,
)

__all__ = ["CSConfig", "ConfigError", "InputConfig", "ModelConfig", "OptimizerConfig", "OptimizerType", "Params",
           "RunConfig", "check_params", "doc", "params_from_dict", "read_yaml", "required"]


doc = setting
"""A params field: its default, its meaning (shown in error messages) and its valid range
(:func:`csrun.typed_config.setting`; ``required`` is the one without a default)."""
MAX_QUEUE_DEPTH = 64
"""The most steps ``csconfig.queue_depth`` lets the chief run ahead (each holds its batch and outputs)."""


@dataclass(kw_only=True)
class RunConfig:
    """``runconfig``: how long to run, where to write, what to log. Every run.py flag overrides its key."""

    mode: Literal["train", "eval", "train_and_eval", "eval_all"] = doc(
        "train", "what to run (run.py --mode; eval_all: every checkpoint in model_dir)")
    max_steps: int | None = doc(None, "stop after this global step; required when neither num_steps nor num_epochs is given", min=1)
    num_steps: int | None = doc(None, "steps to run in this invocation (not with num_epochs)", min=1)
    num_epochs: int | None = doc(None, "epochs to run (not with num_steps)", min=1)
    steps_per_epoch: int | None = doc(None, "steps in an epoch; default: the loader's length", min=1)
    log_steps: int = required("log the loss every this many steps", min=1)
    checkpoint_steps: int = doc(0, "save a checkpoint every this many steps (0: only at the end)", min=0)
    keep_checkpoint_max: int = doc(0, "keep only the newest N checkpoints in model_dir (0: keep all, as legacy); "
                                      "the one a run resumed from is never deleted", min=0)
    save_losses: bool = doc(False, "write every step's loss to model_dir/losses/")
    save_initial_checkpoint: bool = doc(False, "save checkpoint_0.mdl before the first step")
    check_loss_values: bool = doc(True, "stop with 'NaN loss detected.' / 'inf loss detected.'")
    seed: int | None = doc(None, "seed for torch, numpy and Python's random", min=0)
    eval_steps: int | None = doc(None, "eval batches to run (default: one pass over the eval data)", min=1)
    verify_steps: int | None = doc(None, "steps of each program the device checks against eager PyTorch "
                                   "(default: $CSRUN_VERIFY_STEPS, else 1; 0: off)", min=0)
    verify_every: int | None = doc(None, "after the first checked steps, the device checks one step in this many "
                                   "against eager PyTorch (default: $CSRUN_VERIFY_EVERY, else 0: none)", min=0)
    model_dir: str = doc("", "output folder (default: <run.py dir>/model_dir)")
    cs_ip: str | None = doc(None, "system address HOST[:PORT] (port 9000 when none); default $CS_IP")
    cpu: bool = doc(False, "force the CPU path even when cs_ip is set")
    compile_only: bool = doc(False, "full compile, no run")
    validate_only: bool = doc(False, "compile only up to graph/kernel matching")
    checkpoint_path: str | None = doc(None, "checkpoint to load")
    is_pretrained_checkpoint: bool = doc(False, "load checkpoint_path as pretrained: step 0, non-strict, no optimizer state")
    resume: bool = doc(False, "continue from the latest valid checkpoint in model_dir")
    start_over: bool = doc(False, "train from step 0 in a model_dir that holds an earlier run: its checkpoints, "
                                  "losses and summaries are moved into model_dir/previous_run_<time>/ first")
    logging: str = doc("INFO", "chief log level")
    streamer_logging: str = doc("ERROR", "streamer log level")
    compile_dir: str | None = doc(None, "compile output folder (default: model_dir/cs_<hash>)")
    num_csx: int | None = doc(None, "systems training data parallel, each on a batch of batch_size (weight-streaming "
                                    "mode; default: the job's, csrun_wse --num-csx); must match the job's", min=1)
    execution_strategy: Literal["pipeline", "weight_streaming"] = doc(
        "pipeline", "pipeline (the model on the wafer) or weight_streaming (weights in MemoryX, streamed in one layer "
                    "group at a time; what python-ws selects); CSRUN_EXECUTION_STRATEGY and --execution_strategy override it")

    def check(self) -> None:
        """Refuse wrong types, out-of-range values and impossible combinations, naming the keys."""
        check_fields(self, "runconfig")
        if self.num_steps is not None and self.num_epochs is not None:
            raise ConfigError("runconfig: give one of num_steps and num_epochs, not both")
        if (self.max_steps is None and self.num_steps is None and self.num_epochs is None
                and self.mode not in ("eval", "eval_all")):
            raise ConfigError("runconfig.max_steps: required when neither num_steps nor num_epochs is given")
        if self.compile_only and self.validate_only:
            raise ConfigError("Please set one of compile_only and validate_only")
        if self.is_pretrained_checkpoint and not self.checkpoint_path:
            raise ConfigError("runconfig.is_pretrained_checkpoint: needs runconfig.checkpoint_path (--checkpoint_path)")
        for name in ("logging", "streamer_logging"):
            if self.__dict__[name].upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
                raise ConfigError(f"runconfig.{name}: {self.__dict__[name]!r} is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL")


@dataclass(kw_only=True)
class ModelConfig:
    """``model``: fields every model has; each model subclasses it with its own."""

    mixed_precision: bool = required("fp32 weights with float16 compute (cbfloat16 with csconfig.use_cbfloat16); "
                                     "false: float32 compute (exactness checks)")

    def parameter_count(self) -> int | None:
        """The parameters the model makes, from its keys alone (nothing is built); None when this
        config does not know its architecture (:mod:`csrun.run.model_size` checks it)."""
        return None


@dataclass(kw_only=True)
class CSConfig:
    """``csconfig``: settings of the system."""

    use_cbfloat16: bool = doc(False, "compute in cbfloat16 (6-bit exponent, 9-bit mantissa)")
    queue_depth: int = doc(2, "steps the chief may run ahead of the device", min=1, max=MAX_QUEUE_DEPTH)


@dataclass(kw_only=True)
class Params:
    """A whole params file."""

    runconfig: RunConfig
    optimizer: OptimizerConfig | None
    model: ModelConfig
    train_input: InputConfig | None
    eval_input: InputConfig | None
    csconfig: CSConfig
    extra_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The model's own run.py flags (``run(..., extra_args_parser_fn=...)``), by dest name."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data, as written to params_<mode>.yaml (the params sections; not the model's flags)."""
        out = dataclasses.asdict(self)
        out.pop("extra_args", None)
        return out


SECTIONS = ("runconfig", "optimizer", "model", "train_input", "eval_input", "csconfig")


def read_yaml(path: Path, config: str | None = None) -> dict[str, Any]:
    """The mapping in ``path`` (``config``: one top-level key of it)."""
    data = read_yaml_file(path, f"--params {path}")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping of sections ({', '.join(SECTIONS)})")
    if config is not None:
        if config not in data:
            raise ConfigError(f"--config {config!r}: not a top-level key of {path} (there: {', '.join(map(str, data))})")
        data = data[config]
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: {config} must be a mapping of sections")
    return data


def params_from_dict(
    data: dict[str, Any],
    *,
    model_config: type[ModelConfig] = ModelConfig,
    input_config: type[InputConfig] = InputConfig,
) -> Params:
    """Typed, checked params from a YAML mapping."""
    unknown = [k for k in data if k not in SECTIONS]
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section; valid sections: {', '.join(SECTIONS)}")
    if "runconfig" not in data:
        raise ConfigError("runconfig: required section missing")
    if "model" not in data:
        raise ConfigError("model: required section missing")

    def section(name: str, cls: type) -> Any:
        raw = data.get(name)
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise ConfigError(f"{name}: must be a mapping")
        return from_mapping(cls, raw, name)

    params = Params(
        runconfig=section("runconfig", RunConfig),
        optimizer=section("optimizer", OptimizerConfig),
        model=section("model", model_config),
        train_input=section("train_input", input_config),
        eval_input=section("eval_input", input_config),
        csconfig=section("csconfig", CSConfig) or CSConfig(),
    )
    check_params(params)
    return params


def check_params(params: Params) -> None:
    """Every cross-key rule; call again after CLI overrides."""
    params.runconfig.check()
    if params.optimizer is not None:
        params.optimizer.check()
    mode = params.runconfig.mode
    if mode in ("train", "train_and_eval"):
        if params.optimizer is None:
            raise ConfigError("optimizer: required section missing for --mode train")
        if params.train_input is None:
            raise ConfigError("train_input: required section missing for --mode train")
        params.train_input.check("train_input")
    if mode in ("eval", "train_and_eval", "eval_all"):
        if params.eval_input is None:
            raise ConfigError(f"eval_input: required section missing for --mode {mode}")
        params.eval_input.check("eval_input")

