"""run.py's command line: the legacy flags, their overrides of ``runconfig``, the run's path.

Every flag given on the command line overwrites the same key of ``params["runconfig"]``
before the params are typed and checked, so a flag is checked exactly like the YAML key.
See :mod:`csrun.run` for the table of flags. ``--cs_ip`` (default ``CS_IP``, read through
:class:`~csrun.cluster.ClusterInfo`) is parsed by :func:`csrun.address.parse_address` and
recorded as ``host:port``; a bad one is a one-line error. ``--execution_strategy`` (``pipeline`` or
``weight_streaming``) falls back to ``CSRUN_EXECUTION_STRATEGY`` (set by ``python-ws``,
:mod:`csrun.program.execution`), then to ``runconfig.execution_strategy``; a bad value of the
variable is a one-line error naming it. The path is decided by
:func:`csrun.driver.run_path.decide`; :class:`RunPath` is how run.py reports it
(``cpu`` or ``system``, as ``performance.json`` records it).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import csrun
from csrun.env_settings import env_settings
from csrun.address import AddressError, parse_address
from csrun.cluster import ClusterInfo, cluster_info
from csrun.help_style import Parser
from csrun.driver import run_path
from csrun.driver.run_path import EMBEDDED, RunFlags
from csrun.program.execution import EXECUTION_STRATEGIES, EXECUTION_STRATEGY_ENV, PIPELINE, WEIGHT_STREAMING
from csrun.run.model_size import check_model_size
from csrun.run.params import (
    InputConfig,
    ModelConfig,
    Params,
    params_from_dict,
    read_yaml,
)
from csrun.typed_config import ConfigError

RUNCONFIG_FLAGS = ("mode", "cs_ip", "cpu", "compile_only", "validate_only", "model_dir", "checkpoint_path",
                   "is_pretrained_checkpoint", "logging", "compile_dir", "execution_strategy", "resume", "start_over",
                   "max_steps", "eval_steps", "checkpoint_steps", "verify_steps", "verify_every", "num_csx")
"""Flags that overwrite the ``runconfig`` key of the same name."""


def build_parser(prog: str = "run.py", parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """The run.py argument parser (legacy spellings); ``parents``: a model's own flags
    (``run(..., extra_args_parser_fn=...)``), parsed with the rest."""
    for parent in parents:
        if not isinstance(parent, argparse.ArgumentParser):
            raise ConfigError(f"extra_args_parser_fn: must return an argparse.ArgumentParser (add_help=False) or a "
                              f"list of them, got {type(parent).__name__}")
    try:
        p = Parser(prog, "Train or evaluate a model-zoo model on the CPU or the system.",
                   usage="--params FILE --mode MODE [options]", parents=parents,
                   epilog="The manual (paths, YAML keys, environment): python -m pydoc csrun.run")
        _add_run_flags(p, prog)
    except argparse.ArgumentError as exc:  # a model's flag that run.py (or -h) already has
        raise ConfigError(f"extra_args_parser_fn: {exc}: a model's parser needs add_help=False and flags run.py "
                          f"does not have") from None
    return p


def _add_run_flags(p: argparse.ArgumentParser, prog: str) -> None:
    p.add_argument("-cs", "--cs_ip", default=None,
                   metavar="HOST[:PORT]",
                   help="system address (:9000 added when no port), or 'embedded' (default: $CS_IP)")
    p.add_argument("-cpu", "--cpu", action="store_true", default=None, help="force the CPU path")
    p.add_argument("--version", action="version", version=f"{prog} (csrun {csrun.__version__})",
                   help="print the version and exit")
    p.add_argument("-p", "--params", required=True, metavar="FILE", help="params YAML file")
    p.add_argument("-m", "--mode", required=True, choices=("train", "eval", "train_and_eval", "eval_all"),
                   help="what to run (eval_all: evaluate every checkpoint in model_dir)")
    p.add_argument("--compile_only", action="store_true", default=None, help="full compile, no run")
    p.add_argument("--validate_only", action="store_true", default=None,
                   help="compile only up to graph/kernel matching")
    p.add_argument("-o", "--model_dir", default=None, metavar="DIR", help="output folder (default: <run.py dir>/model_dir)")
    p.add_argument("--checkpoint_path", default=None, metavar="FILE", help="checkpoint to load")
    p.add_argument("--is_pretrained_checkpoint", action="store_true", default=None,
                   help="with --checkpoint_path: step 0, non-strict load, no optimizer state")
    p.add_argument("--logging", default=None, metavar="LEVEL", help="chief log level (DEBUG, INFO, WARNING, ERROR)")
    p.add_argument("--config", default=None, metavar="KEY", help="use this top-level key of the params YAML")
    p.add_argument("-c", "--compile_dir", default=None, metavar="DIR", help="compile output folder")
    p.add_argument("--execution_strategy", default=None, choices=EXECUTION_STRATEGIES,
                   help=f"pipeline (the model on the wafer) or weight_streaming (weights streamed from MemoryX); "
                        f"default ${EXECUTION_STRATEGY_ENV}, then runconfig.execution_strategy")
    p.add_argument("--num_csx", type=int, default=None, metavar="N",
                   help="runconfig.num_csx: systems training data parallel (weight-streaming mode; the job's own, "
                        "csrun_wse --num-csx N, by default)")
    p.add_argument("--resume", action="store_true", default=None,
                   help="continue from the latest valid checkpoint in model_dir")
    p.add_argument("--start_over", action="store_true", default=None,
                   help="train from step 0 in a model_dir an earlier run used: its files are moved into "
                        "model_dir/previous_run_<time>/ first (nothing is deleted)")
    p.add_argument("--max_steps", type=int, default=None, metavar="N", help="runconfig.max_steps: the last global step")
    p.add_argument("--eval_steps", type=int, default=None, metavar="N", help="runconfig.eval_steps: eval batches to run")
    p.add_argument("--checkpoint_steps", type=int, default=None, metavar="N",
                   help="runconfig.checkpoint_steps: save every this many steps (0: only at the end)")
    p.add_argument("--verify_steps", type=int, default=None, metavar="N",
                   help="runconfig.verify_steps: check the first N steps of each program against eager PyTorch "
                        "(0: off; default $CSRUN_VERIFY_STEPS, else 1)")
    p.add_argument("--verify_every", type=int, default=None, metavar="K",
                   help="runconfig.verify_every: after those, check one step in K against eager PyTorch "
                        "(0: none; default $CSRUN_VERIFY_EVERY, else 0)")
    for action in p._actions:  # unset, a runconfig flag takes the YAML's value: say so once
        if action.dest in RUNCONFIG_FLAGS and action.default is None and action.nargs != 0 and not action.required \
                and action.help and "default" not in action.help:
            action.help += f" (default: runconfig.{action.dest})"


def normalize_cs_ip(value: str | None) -> str | None:
    """``HOST`` -> ``HOST:9000`` (:func:`~csrun.address.parse_address`); empty -> None;
    ``embedded`` (the in-process emulator) stays. A bad address raises :class:`~csrun.address.AddressError`."""
    if value is None:
        return None
    value = str(value).strip()
    if not value:
        return None
    if value.lower() == EMBEDDED:
        return EMBEDDED
    return str(parse_address(value))


def parse_args(argv: list[str] | None, *, prog: str = "run.py", environ: Mapping[str, str] | None = None,
               parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.Namespace:
    """The parsed flags; ``cs_ip`` falls back to ``CS_IP``, ``execution_strategy`` to
    ``CSRUN_EXECUTION_STRATEGY``. argparse exits 2 on a bad flag, address or strategy."""
    parser = build_parser(prog, parents)
    args = parser.parse_args(argv)
    if args.execution_strategy is None:
        args.execution_strategy = env_settings(environ).execution_strategy
    from_env = args.cs_ip is None
    if from_env:
        args.cs_ip = cluster_info(environ).cs_ip or None
    try:
        if not from_env and not args.cs_ip.strip():  # given, and empty: not the same as not given
            parse_address(args.cs_ip)
        args.cs_ip = normalize_cs_ip(args.cs_ip)
    except AddressError as exc:
        parser.error(f"{'CS_IP' if from_env else 'argument -cs/--cs_ip'}: {exc}")
    args.extra_args = {a.dest: getattr(args, a.dest) for parent in parents for a in parent._actions
                       if a.dest != "help" and hasattr(args, a.dest)}
    return args


def apply_overrides(data: dict[str, Any], args: argparse.Namespace, *, default_model_dir: str | None) -> dict[str, Any]:
    """A copy of the YAML mapping with every given flag written into ``runconfig``."""
    out = dict(data)
    rc = out.get("runconfig")
    if rc is None:
        rc = {}
    if not isinstance(rc, dict):
        raise ConfigError("runconfig: must be a mapping")
    rc = dict(rc)
    for name in RUNCONFIG_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            rc[name] = value
    if rc.get("cs_ip") is not None:
        try:
            rc["cs_ip"] = normalize_cs_ip(str(rc["cs_ip"]))
        except AddressError as exc:
            raise ConfigError(f"runconfig.cs_ip: {exc}") from None
    if not rc.get("model_dir"):
        rc["model_dir"] = default_model_dir or "model_dir"
    out["runconfig"] = rc
    return out


def load_params(args: argparse.Namespace, *, model_config: type[ModelConfig] = ModelConfig,
                input_config: type[InputConfig] = InputConfig, default_model_dir: str | None = None,
                meta: bool = False) -> Params:
    """Read ``--params`` (``--config``), apply the flags, type and check everything, the model's size
    included (:func:`~csrun.run.model_size.check_model_size`; ``meta``: it is built with shapes only)."""
    data = read_yaml(Path(args.params), args.config)
    data = apply_overrides(data, args, default_model_dir=default_model_dir)
    try:
        params = params_from_dict(data, model_config=model_config, input_config=input_config)
    except ConfigError as exc:
        raise _as_flag_error(exc, args) from None
    check_model_size(params.model, meta=meta)
    params.extra_args = dict(getattr(args, "extra_args", {}) or {})
    return params


STEP_FLAGS = ("max_steps", "eval_steps", "checkpoint_steps", "verify_steps", "verify_every", "num_csx")
"""Flags for ``runconfig`` step counts: a bad value is reported under the flag's name."""


def _as_flag_error(exc: ConfigError, args: argparse.Namespace) -> ConfigError:
    """A step key's check failed on a value given by its flag: say ``--flag: ...`` (same check, same exit 2)."""
    text = getattr(exc, "what", str(exc))
    for name in STEP_FLAGS:
        prefix = f"runconfig.{name}: "
        if getattr(args, name, None) is not None and text.startswith(prefix):
            return ConfigError(f"--{name}: {text[len(prefix):]} (overrides runconfig.{name})",
                               fix=getattr(exc, "fix", None))
    return exc


PathName = Literal["cpu", "system"]


@dataclass(frozen=True, kw_only=True)
class RunPath:
    """Where the chief runs the steps, as run.py reports it."""

    kind: PathName
    """``cpu`` (eager PyTorch) or ``system`` (the device: a server at cs_ip, the embedded emulator, or a compile)."""
    cs_ip: str | None
    """The server's address, or None for the embedded emulator / CPU."""
    reason: str
    """Why this path, for the log."""


def choose_path(params: Params, environ: Mapping[str, str] | None = None, *,
                info: ClusterInfo | None = None) -> RunPath:
    """The path :func:`csrun.driver.run_path.decide` picks for the params' runconfig.

    The system when cs_ip, compile_only or validate_only is set, or when launched by
    csrun_wse (``ClusterInfo.launcher``) without ``--cpu`` (then the emulator runs embedded);
    ``--cpu`` wins over cs_ip and the launcher; compile_only / validate_only always compile.
    ``info`` defaults to :func:`~csrun.cluster.cluster_info` of ``environ`` (``os.environ``).
    """
    rc = params.runconfig
    flags = RunFlags(cs_ip=rc.cs_ip, cpu=bool(rc.cpu), compile_only=bool(rc.compile_only),
                     validate_only=bool(rc.validate_only))
    try:
        path = run_path.decide(flags, cluster_info(environ) if info is None else info)
    except (run_path.RunPathError, AddressError) as exc:
        raise ConfigError(str(exc)) from None
    return RunPath(kind="cpu" if path.on_cpu else "system", cs_ip=path.cs_ip, reason=path.reason)


def check_system_rules(params: Params, path: RunPath) -> None:
    """What the system refused that the CPU allows, and how it ran what it accepted.

    Refused: ``train_and_eval``; ``grad_accum_steps > 1`` when pipelined ("Gradient Accumulation
    not supported on CS workflow."). Accepted in weight-streaming mode, as the system's
    weight-streaming runs accepted gradient accumulation (its compiler split each batch into
    micro batches and summed their gradients on the way to MemoryX, ``use_cs_grad_accum``): the
    ``k`` batches of one step are streamed as one batch of ``k x batch_size``, so
    ``params.train_input.batch_size`` becomes ``k x batch_size`` and ``grad_accum_steps`` 1 (the
    params are changed in place, ``params_train.yaml`` records what ran, and the chief says so);
    the compile then picks the micro batch that fits the wafer (the plan's ``micro_batch_size``).
    The update is the accumulated one (for a loss that is a mean over samples; exact up to float
    rounding), the samples are the same ones in the same order, and the step's loss is the whole
    batch's (the CPU path reports its last micro batch's).
    """
    check_num_csx(params, path)
    if path.kind != "system":
        return
    rc = params.runconfig
    if rc.mode == "train_and_eval":
        raise ConfigError("Training with Eval on CS is not currently supported.")
    opt = params.optimizer
    if opt is None or opt.grad_accum_steps == 1 or rc.mode in ("eval", "eval_all"):
        return
    if rc.execution_strategy == PIPELINE:
        raise ConfigError("Gradient Accumulation not supported on CS workflow.",
                          fix=f"set optimizer.grad_accum_steps to 1, or train in weight-streaming mode (python-ws, or "
                              f"--execution_strategy {WEIGHT_STREAMING}), which accepts it")
    if params.train_input is None:
        return
    k, batch = opt.grad_accum_steps, params.train_input.batch_size
    params.train_input.batch_size = k * batch
    opt.grad_accum_steps = 1
    if cluster_info().is_chief:
        print(f"weight streaming: grad_accum_steps {k} x batch_size {batch} runs as one batch of {k * batch} a step; "
              f"the device splits it into micro batches (the compile's plan says how many samples at once)", flush=True)


def check_num_csx(params: Params, path: RunPath, job_systems: int | None = None) -> None:
    """``runconfig.num_csx`` against the job's systems (``job_systems``: :attr:`ClusterInfo.num_csx`).

    The job's count is the launcher's (``csrun_wse --num-csx N``); the params may state it, and
    then must agree. On the system a cluster trains in weight-streaming mode only, and trains
    only (eval runs on one system): refused otherwise, naming the fix. On the CPU ``num_csx``
    is the system's: the run trains batches of ``batch_size`` and says so once.
    """
    rc = params.runconfig
    info = cluster_info()
    job = info.num_csx if job_systems is None else job_systems
    stated = rc.num_csx
    if path.kind != "system":
        shown = stated if stated is not None and stated > 1 else job
        if shown > 1 and info.is_chief:
            print(f"csrun: num_csx {shown} is the system's: this CPU run trains one stream of batches of batch_size"
                  + (f" (the job's {job} system tasks stay idle)" if job > 1 else ""), flush=True)
        return
    if stated is not None and stated != job:
        raise ConfigError(f"runconfig.num_csx is {stated} but this job has {job} system(s)",
                          fix=f"launch it with csrun_wse --num-csx {stated} (the launcher allocates the systems), "
                              f"or drop num_csx to take the job's")
    rc.num_csx = job
    if job == 1:
        return
    if rc.execution_strategy == PIPELINE:
        raise ConfigError(f"num_csx {job}: a cluster of systems trains in weight-streaming mode only",
                          fix=f"run with python-ws, or --execution_strategy {WEIGHT_STREAMING} (pipelined mode "
                              "runs on one system)")
    if rc.compile_only or rc.validate_only:
        return  # a compile is one system's program, the same at any N
    if rc.mode != "train":
        raise ConfigError(f"--mode {rc.mode} with num_csx {job}: eval runs on one system (the cluster trains only)",
                          fix="run eval (and eval_all) in a job of one system: csrun_wse without --num-csx")
