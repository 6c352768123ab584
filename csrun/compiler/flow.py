"""The compiler's entry points: validate_only and compile_only.

Their result, :func:`load_program` and the exit codes live in :mod:`csrun.compiler.result`
(re-exported here).

``validate_only`` captures the step and runs every check (no placement, nothing written).
``compile_only`` does that, then places the program on the wafer model in the settings'
execution strategy (:func:`plan_program`: pipelined, :mod:`csrun.compiler.placement`, or weight
streaming, :mod:`csrun.compiler.streaming`), and writes (or reuses) ``cs_<hash>/``; the strategy
and the MemoryX model are part of the compile and source keys. A pipelined model that does not
fit fails with :class:`~csrun.compiler.errors.ModelDoesNotFit` whose fix says whether the
weight-streaming plan fits and how to select it. Both return a :class:`CompileResult`; neither raises for the user's
problems (they are in ``result.problems``; ``result.raise_for_problems()`` raises them as one
error). The same call serves the first step of a real run: ``result.exported_program()``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from typing import Any, Iterable

import torch
from rich.console import Console

from csrun.compiler import report
from csrun.consoles import time_prefix
from csrun.compiler.cache.compile_dir import (
    MARKER, add_source_key, build_atomically, compile_key, find_by_source_key, marker_source_keys, read_marker,
    source_key,
)
from csrun.compiler.cache.program_io import PROGRAM_FILE, save_program
from csrun.compiler.capture import capture, input_schema
from csrun.compiler.checks import run_checks
from csrun.compiler.costs import layer_costs
from csrun.compiler.errors import CompileError, ConfigError, CumulativeBatchNorm, ModelDoesNotFit, Problem
from csrun.compiler.locate import caller_location
from csrun.compiler.optim import group_learning_rates, legacy_type_of, optimizer_spec_from_torch
from csrun.compiler.placement import Plan, place
from csrun.compiler.report import human_bytes
from csrun.compiler.settings import CompileSettings
from csrun.compiler.spec import ProgramSpec
from csrun.compiler.streaming import STREAMING_WHY, place_streaming
from csrun.compiler.result import (  # noqa: F401  (CompileResult, exit_code, load_program: the entry points' too)
    ESTIMATE_FILE, PLAN_FILE, REPORT_FILE, SPEC_FILE, CompileResult, exit_code, load_program,
)
from csrun.compiler.wafer import MEMORYX, WSE2, MemoryXSpec, WaferSpec



def settings_with_optimizer(settings: CompileSettings, optimizer: torch.optim.Optimizer | None,
                            model: torch.nn.Module, *, learning_rates: list[Any] | None = None) -> CompileSettings:
    """Fill the optimizer (and the learning rate) from a torch optimizer object when the settings
    have none (the user-API path; the params path sets them from the YAML).

    ``learning_rates``: one legacy learning-rate value per param group (the schedules of torch
    LR schedulers); without them a schedule in the settings drives every group (as on the CPU),
    else each group keeps its own constant ``lr``.
    """
    if optimizer is None or settings.optimizer is not None or legacy_type_of(optimizer) is None:
        return settings
    if learning_rates is None and settings.learning_rate in (None, 0.0):
        learning_rates = list(group_learning_rates(optimizer))
    lr = learning_rates[0] if learning_rates is not None else settings.learning_rate
    spec = optimizer_spec_from_torch(optimizer, model=model, learning_rates=learning_rates)
    return replace(settings, optimizer=spec, learning_rate=lr)


def _say(console: Console | None, text: str) -> None:
    if console is not None:
        console.print(time_prefix(console.file) + text, markup=False, highlight=False)


WS_HOW = "python-ws, or run.py --execution_strategy weight_streaming, or runconfig.execution_strategy: weight_streaming"
"""How a user selects weight-streaming mode (named in fixes)."""


def plan_program(program: torch.export.ExportedProgram, spec: ProgramSpec, settings: CompileSettings, *,
                 wafer: WaferSpec = WSE2, memoryx: MemoryXSpec = MEMORYX) -> tuple[Plan, Plan | None]:
    """The plan in the settings' execution strategy, and the other strategy's plan when it tells
    the user something: the weight-streaming plan of a pipelined model that does not fit (for the
    fix), the pipelined plan of a weight-streaming one (for ``why``)."""
    costs = layer_costs(program, spec)
    if settings.streaming:
        piped = place(costs, spec, wafer)
        verdict = (f"pipelined it would need {human_bytes(piped.sram_needed_bytes)} of "
                   f"{human_bytes(piped.sram_available_bytes)} SRAM ({'fits' if piped.fits else 'does not fit'})")
        return place_streaming(costs, spec, wafer, memoryx, why=f"{STREAMING_WHY}; selected by execution_strategy: "
                               f"weight_streaming; {verdict}"), piped
    plan = place(costs, spec, wafer)
    if plan.fits:
        return plan, None
    return plan, place_streaming(costs, spec, wafer, memoryx)


def _does_not_fit(plan: Plan, other: Plan | None) -> ModelDoesNotFit:
    big = ", ".join(f"{l.name} ({human_bytes(l.sram_needed_bytes)})" for l in plan.biggest_layers(5))
    if plan.streaming:
        mx = plan.memoryx or MEMORYX
        what = (f"the model does not fit on {plan.wafer.name} in weight-streaming mode (estimate): "
                + (f"MemoryX needs {human_bytes(plan.memoryx_needed_bytes)} for weights, master copies, optimizer "
                   f"state and gradient sums and has {human_bytes(mx.capacity_bytes)}" if plan.micro_batch_size else
                   f"one sample needs {human_bytes(plan.sram_needed_bytes)} of SRAM resident at once (a layer group's "
                   f"weights and gradients, the next group's weights, the activations) and the wafer has "
                   f"{human_bytes(plan.sram_available_bytes)}")
                + f". Biggest layer groups: {big}")
        return ModelDoesNotFit(what, fix="make the layers narrower or the sequence shorter (one layer group and one "
                               "sample's activations must fit the wafer), or use an optimizer with less state",
                               location=caller_location())
    fix = ModelDoesNotFit.fix
    if other is not None and other.fits:
        fix += (f"; or train it in weight-streaming mode ({WS_HOW}): its plan fits (estimate: "
                f"{human_bytes(other.sram_needed_bytes)} resident of {human_bytes(other.sram_available_bytes)}, "
                f"micro batch {other.micro_batch_size}, {human_bytes(other.memoryx_needed_bytes)} in MemoryX)")
    elif other is not None:
        fix += f"; weight-streaming mode ({WS_HOW}) would not fit it either"
    return ModelDoesNotFit(
        f"the model does not fit on {plan.wafer.name} (estimate): it needs {human_bytes(plan.sram_needed_bytes)} "
        f"({plan.sram_needed_bytes:,.0f} bytes) of SRAM for weights, gradients, optimizer state and in-flight "
        f"activations; the wafer has {human_bytes(plan.sram_available_bytes)} ({plan.sram_available_bytes:,.0f} bytes, "
        f"{plan.wafer.num_pes:,} PEs x {human_bytes(plan.wafer.sram_bytes_per_pe)}). Biggest layers: {big}",
        fix=fix, location=caller_location())


def target_text(settings: CompileSettings, memoryx: MemoryXSpec) -> str:
    """What the compile targets besides the wafer, for the compile and source keys: empty when pipelined
    (the keys stay those of earlier compiles), the strategy and MemoryX when streaming, so the same
    program compiled for the other strategy gets its own directory."""
    if not settings.streaming:
        return ""
    return "\n" + json.dumps({"execution_strategy": settings.execution_strategy, "memoryx": memoryx.to_dict()},
                             sort_keys=True)


def _run(model: torch.nn.Module, batch: Any, *, settings: CompileSettings, optimizer: torch.optim.Optimizer | None,
         lr_schedulers: Iterable[Any] | None, dataloader: Any, validate: bool, model_dir: str | None, compile_dir: str | None,
         wafer: WaferSpec, reuse_by_source: bool, console: Console | None, step_key: str = "",
         memoryx: MemoryXSpec = MEMORYX) -> CompileResult:
    t0 = time.perf_counter()
    _say(console, report.MSG_COMPILING)
    settings = settings_with_optimizer(settings, optimizer, model)
    problems: list[Problem] = list(run_checks(model=model, settings=settings, optimizer=optimizer, lr_schedulers=lr_schedulers,
                                         dataloader=dataloader))
    if not validate and settings.program_mode == "train" and settings.optimizer is None and optimizer is None:
        problems.append(ConfigError("a training compile needs an optimizer",
                                    fix="pass optimizer=<torch optimizer> or set the params optimizer section",
                                    location=caller_location()))
    if not validate and not problems and reuse_by_source:
        hit = _fast_hit(model, batch, settings=settings, model_dir=model_dir, compile_dir=compile_dir, wafer=wafer,
                        step_key=step_key, memoryx=memoryx)
        if hit is not None:
            hit.seconds = time.perf_counter() - t0
            _finish(hit, console)
            return hit
    if any(isinstance(p, CumulativeBatchNorm) for p in problems):  # the capture would fail on it again, less clearly
        result = CompileResult(ok=False, validate_only=validate, problems=problems, spec=None)
        result.seconds = time.perf_counter() - t0
        _finish(result, console)
        return result
    cap = capture(model, batch, settings=settings)
    problems += cap.problems
    result = CompileResult(ok=False, validate_only=validate, problems=problems, spec=cap.spec,
                           capture_seconds=cap.seconds)
    if problems or cap.program is None or cap.spec is None:
        result.seconds = time.perf_counter() - t0
        _finish(result, console)
        return result
    result.program = program = cap.program
    if validate:
        result.ok = True
        result.seconds = time.perf_counter() - t0
        _finish(result, console)
        return result
    plan, other = plan_program(cap.program, cap.spec, settings, wafer=wafer, memoryx=memoryx)
    result.plan, result.plan_json, result.estimate_json = plan, plan.plan_json(), plan.estimate_json()
    if not plan.fits:
        result.problems.append(_does_not_fit(plan, other))
        result.seconds = time.perf_counter() - t0
        _finish(result, console)
        return result
    spec_json = cap.spec.to_json()
    key = compile_key(cap.program, spec_json + target_text(settings, memoryx), wafer)
    skey = _source_key(model, batch, settings, wafer, step_key, memoryx)
    target = compile_dir or os.path.join(model_dir or "model_dir", f"cs_{key}")
    result.directory = os.path.abspath(target)

    def write(tmp: str) -> None:
        save_program(program, os.path.join(tmp, PROGRAM_FILE))
        with open(os.path.join(tmp, SPEC_FILE), "w") as f:
            f.write(spec_json)
        with open(os.path.join(tmp, PLAN_FILE), "w") as f:
            json.dump({**result.plan_json, "compile_key": key}, f, indent=1)  # type: ignore[dict-item]
        with open(os.path.join(tmp, ESTIMATE_FILE), "w") as f:
            json.dump(result.estimate_json, f, indent=1)
        result.seconds = time.perf_counter() - t0
        with open(os.path.join(tmp, REPORT_FILE), "w") as f:
            f.write(report.report_text(result))

    existing = read_marker(target)
    if existing is not None and existing.get("compile_key") != key:
        # an explicit compile_dir holding another (complete) program: rebuild it
        os.remove(os.path.join(target, MARKER))
    try:
        built = build_atomically(target, write, compile_key=key, source_key=skey)
    except (CompileError, ConfigError) as exc:
        result.problems.append(exc)
        result.seconds = time.perf_counter() - t0
        _finish(result, console)
        return result
    result.cache_hit = built.reused
    if built.reused:
        add_source_key(target, skey)
    result.ok = True
    result.seconds = time.perf_counter() - t0
    _finish(result, console)
    return result


def _source_key(model: torch.nn.Module, batch: Any, settings: CompileSettings, wafer: WaferSpec, step_key: str,
                memoryx: MemoryXSpec) -> str:
    inputs, tree = input_schema(batch)
    schema = json.dumps([[i.path, i.dtype, list(i.shape)] for i in inputs]) + tree
    spec = settings.program_spec(inputs=inputs, input_tree=tree, outputs=())
    return source_key(model, schema, spec.to_json() + target_text(settings, memoryx) + f"|{settings.mode}|{step_key}",
                      wafer)


def _fast_hit(model: torch.nn.Module, batch: Any, *, settings: CompileSettings, model_dir: str | None,
              compile_dir: str | None, wafer: WaferSpec, step_key: str = "",
              memoryx: MemoryXSpec = MEMORYX) -> CompileResult | None:
    try:
        skey = _source_key(model, batch, settings, wafer, step_key, memoryx)
    except (CompileError, ConfigError):
        return None
    if compile_dir is not None:
        marker = read_marker(compile_dir)
        directory = compile_dir if marker is not None and skey in marker_source_keys(marker) else None
    else:
        directory = find_by_source_key(model_dir or "model_dir", skey)
    if directory is None:
        return None
    try:
        with open(os.path.join(directory, SPEC_FILE)) as f:
            spec = ProgramSpec.from_json(f.read())
        with open(os.path.join(directory, PLAN_FILE)) as f:
            plan_json = json.load(f)
        with open(os.path.join(directory, ESTIMATE_FILE)) as f:
            estimate_json = json.load(f)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        plan = Plan.from_json(plan_json, estimate_json)
    except (KeyError, TypeError):
        plan = None
    return CompileResult(ok=True, spec=spec, plan=plan, plan_json=plan_json, estimate_json=estimate_json,
                         directory=os.path.abspath(directory), cache_hit=True)


def _finish(result: CompileResult, console: Console | None) -> None:
    if console is not None:
        report.print_result(result, console)


def validate_only(model: torch.nn.Module, batch: Any, *, settings: CompileSettings,
                  optimizer: torch.optim.Optimizer | None = None, lr_schedulers: Iterable[Any] | None = (),
                  dataloader: Any = None, console: Console | None = None) -> CompileResult:
    """Capture the step and run every check; no placement, nothing written.

    ``batch`` is one batch as the model's forward receives it; ``optimizer`` (a torch
    optimizer object) fills the optimizer spec when ``settings.optimizer`` is None;
    ``lr_schedulers`` are torch schedulers the caller knows of (refused; None: the host computes the
    learning rate of each step and hands it to the device); ``dataloader`` is
    checked for short last batches. ``console``: where messages go (None: silent).
    """
    return _run(model, batch, settings=settings, optimizer=optimizer, lr_schedulers=lr_schedulers,
                dataloader=dataloader, validate=True, model_dir=None, compile_dir=None, wafer=WSE2,
                reuse_by_source=False, console=console)


def compile_only(model: torch.nn.Module, batch: Any, *, settings: CompileSettings,
                 model_dir: str | None = None, compile_dir: str | None = None,
                 optimizer: torch.optim.Optimizer | None = None, lr_schedulers: Iterable[Any] | None = (),
                 dataloader: Any = None, wafer: WaferSpec = WSE2, reuse_by_source: bool = True,
                 console: Console | None = None, step_key: str = "", memoryx: MemoryXSpec = MEMORYX) -> CompileResult:
    """Capture, check, place on the wafer model and write (or reuse) the compile directory.

    ``settings.execution_strategy`` picks the placement (pipelined, or weight streaming with
    ``memoryx`` as the off-wafer store).

    The directory is ``compile_dir`` when given, else ``model_dir/cs_<hash>/``. With
    ``reuse_by_source`` a complete directory whose source key matches is reused without
    capturing (see :mod:`csrun.compiler.cache.compile_dir`); ``step_key`` (the recorded
    step's text, when the forward replays one) is part of that key. Other arguments as
    :func:`validate_only`.
    """
    return _run(model, batch, settings=settings, optimizer=optimizer, lr_schedulers=lr_schedulers,
                dataloader=dataloader, validate=False, model_dir=model_dir, compile_dir=compile_dir, wafer=wafer,
                reuse_by_source=reuse_by_source, console=console, step_key=step_key, memoryx=memoryx)
