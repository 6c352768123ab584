"""Checks that need no graph: optimizer, schedulers, state, precision, data, mode, flags.

Each check returns a list of :class:`~csrun.compiler.errors.CompileError` (empty when fine)
so a compile can report every problem at once. Locations: a custom class's own source
line where the problem is in it (e.g. the line of ``step()`` that creates state lazily),
otherwise the user's line that called into csrun.
"""

from __future__ import annotations

import copy
import functools
import sys
from types import FrameType
from typing import Any, Iterable, Sequence

import torch
import torch.utils._pytree as pytree

from csrun.compiler.errors import (
    CompileError, ConflictingCompileFlags, CumulativeBatchNorm, GradAccumNotSupported, LazyOptimizerState,
    LRSchedulerNotSupported, ShapeChanged, ShortLastBatch, TrainAndEvalNotSupported,
    WeightsNotFloat32,
)
from csrun.compiler.lr_schedulers import check_scheduler
from csrun.compiler.locate import attribute_location, caller_location, is_user_file, location_of
from csrun.compiler.optim import is_torch_builtin, legacy_type_of, unsupported_optimizer_error
from csrun.compiler.settings import CompileSettings
from csrun.compiler.spec import ProgramSpec


def check_compile_flags(*, compile_only: bool, validate_only: bool) -> None:
    """Refuse ``--compile_only`` with ``--validate_only`` (the legacy message)."""
    if compile_only and validate_only:
        raise ConflictingCompileFlags("Please set one of compile_only and validate_only")


def check_mode(settings: CompileSettings) -> list[CompileError]:
    """train_and_eval is refused on the system; gradient accumulation too, when pipelined
    (weight-streaming mode accepts it, as the system's weight-streaming runs did)."""
    problems: list[CompileError] = []
    if settings.mode == "train_and_eval":
        problems.append(TrainAndEvalNotSupported("Training with Eval on CS is not currently supported.",
                                                 location=caller_location()))
    if settings.grad_accum_steps > 1 and not settings.streaming:
        problems.append(GradAccumNotSupported(
            f"Gradient Accumulation not supported on CS workflow. (grad_accum_steps={settings.grad_accum_steps})",
            location=caller_location()))
    return problems


def check_batch_norm(model: torch.nn.Module) -> list[CompileError]:
    """A training step with a batch norm whose ``momentum`` is None (a cumulative moving average):
    refused at the line that makes the module (its parent's ``self.<name> = ...``)."""
    problems: list[CompileError] = []
    parents = {id(child): (parent, name) for parent in model.modules() for name, child in parent.named_children()}
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.momentum is None \
                and module.training and module.track_running_stats:
            parent, name = parents.get(id(module), (None, ""))
            where = attribute_location(type(parent), name) if parent is not None else None
            problems.append(CumulativeBatchNorm(
                f"{type(module).__name__}(momentum=None) at model.{path}: a cumulative average of the running "
                "statistics", location=where or caller_location()))
    return problems


def check_optimizer(optimizer: torch.optim.Optimizer | None) -> list[CompileError]:
    """The optimizer's type must be one the system has."""
    if optimizer is None or legacy_type_of(optimizer) is not None:
        return []
    return [unsupported_optimizer_error(optimizer)]


def has_lr_scheduler(optimizer: torch.optim.Optimizer) -> bool:
    """True when a torch LRScheduler was built on this optimizer.

    Schedulers wrap ``optimizer.step`` (marked ``_wrapped_by_lr_sched``) and write
    ``initial_lr`` into every param group; either sign counts.
    """
    if getattr(getattr(optimizer, "step", None), "_wrapped_by_lr_sched", False):
        return True
    return any("initial_lr" in g for g in optimizer.param_groups)


def check_lr_schedulers(optimizer: torch.optim.Optimizer | None,
                        schedulers: Sequence[Any] | None = ()) -> list[CompileError]:
    """Torch lr_scheduler objects the caller passes are refused unless the device runs them
    (:mod:`csrun.compiler.lr_schedulers`; the caller then compiles their schedule); one found
    attached to the optimizer that the caller did not pass is refused. ``schedulers`` None: the
    host computes each step's learning rate (the driver's device path), nothing to check."""
    if schedulers is None:
        return []
    problems: list[CompileError] = []
    for s in schedulers:
        try:
            check_scheduler(s)
        except LRSchedulerNotSupported as exc:
            problems.append(LRSchedulerNotSupported(exc.what, fix=exc.fix, location=caller_location()))
    if optimizer is not None and not schedulers and has_lr_scheduler(optimizer):
        problems.append(LRSchedulerNotSupported(
            "a torch lr_scheduler is attached to the optimizer, but its schedule was not handed to the compile: "
            "the system cannot change a Python learning rate between steps", location=caller_location()))
    return problems


class _RecordingState(dict):
    """A per-parameter state dict that remembers where user code first added a key."""

    def __init__(self, *args: Any, sink: list, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sink = sink

    def __setitem__(self, key: Any, value: Any) -> None:
        if key not in self:
            frame: FrameType | None = sys._getframe(1)
            while frame is not None and not is_user_file(frame.f_code.co_filename):
                frame = frame.f_back
            if frame is not None:
                self._sink.append((key, location_of(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)))
            else:
                self._sink.append((key, None))
        super().__setitem__(key, value)


class _RecordingDefaultDict(dict):
    def __init__(self, original: dict, sink: list) -> None:
        super().__init__({k: _RecordingState(v, sink=sink) for k, v in original.items()})
        self._sink = sink

    def __missing__(self, key: Any) -> _RecordingState:
        value = _RecordingState(sink=self._sink)
        dict.__setitem__(self, key, value)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        if key not in self:
            self._sink.append((key, None))
        super().__setitem__(key, value if isinstance(value, _RecordingState) else _RecordingState(value, sink=self._sink))


def check_lazy_state(optimizer: torch.optim.Optimizer | None) -> list[CompileError]:
    """A custom optimizer must create its state before the first step.

    How: the optimizer is deep-copied (with its parameters), every copied parameter gets a
    zero gradient, and the copy's ``step()`` runs once with ``optimizer.state`` replaced by
    dicts that record where a state key is first set. Any key set by that step is state
    created lazily; the error names the line that created it. The user's optimizer and
    model are untouched. torch.optim's own classes are skipped: the device preinitializes
    their state itself (as the system's optimizer wrapper did). A step that fails on zero
    gradients is not judged here.
    """
    if optimizer is None or is_torch_builtin(optimizer):
        return []
    try:
        dry = copy.deepcopy(optimizer)
    except Exception:
        return []
    sink: list = []
    for group in dry.param_groups:
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    dry.state = _RecordingDefaultDict(dict(dry.state), sink)  # type: ignore[assignment]
    try:
        with torch.no_grad():
            dry.step()
    except Exception:
        return []
    if not sink:
        return []
    keys = sorted({str(k) for k, _ in sink if not isinstance(k, torch.Tensor)})
    loc = next((l for _, l in sink if l is not None), None) or caller_location()
    return [LazyOptimizerState(
        f"{type(optimizer).__qualname__}.step() creates optimizer state on its first step"
        + (f" ({', '.join(keys)})" if keys else "") + "; after construction optimizer.state is empty",
        location=loc)]


def check_precision(model: torch.nn.Module, settings: CompileSettings) -> list[CompileError]:
    """Every floating-point weight must be float32: the device keeps float32 weights (the system
    did), and computes in 16 bits from them when mixed precision is on; a float64 or 16-bit model
    would compute otherwise than its eager run."""
    bad = [(n, p.dtype) for n, p in model.named_parameters() if p.is_floating_point() and p.dtype != torch.float32]
    if not bad:
        return []
    listed = ", ".join(f"{n} ({str(d).removeprefix('torch.')})" for n, d in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
    why = "mixed_precision is on but" if settings.mixed_precision else "the device keeps float32 weights, but"
    return [WeightsNotFloat32(f"{why} {len(bad)} weight(s) are not float32: {listed}", location=caller_location())]


def check_dataloader(dataloader: Any) -> list[CompileError]:
    """A dataloader must not produce a short last batch: ``drop_last`` must be True.

    Any ``drop_last=False`` is refused (sharding across streamers can make a short batch
    even when the length divides evenly); the message says whether it divides evenly.
    """
    if dataloader is None:
        return []
    batch_size = getattr(dataloader, "batch_size", None)
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    if batch_size is None and batch_sampler is not None:
        # a user batch_sampler decides; an unknown one (no drop_last attribute) is not judged
        drop_last = getattr(batch_sampler, "drop_last", None)
        batch_size = getattr(batch_sampler, "batch_size", None)
    elif batch_size is None:
        return []  # no automatic batching: every item is one fixed-size batch
    else:
        drop_last = getattr(dataloader, "drop_last", None)
    if drop_last is None or drop_last:
        return []
    detail = ""
    try:
        n = len(dataloader.dataset)
        if batch_size:
            rem = n % batch_size
            detail = (f": len(dataset)={n} with batch_size={batch_size} leaves a last batch of {rem}" if rem
                      else f" (len(dataset)={n} divides by batch_size={batch_size} now, but shards or a changed dataset may not)")
    except TypeError:
        pass
    return [ShortLastBatch(f"the dataloader has drop_last=False{detail}", location=caller_location())]


@functools.lru_cache(maxsize=16)
def captured_treespec(dumped: str) -> pytree.TreeSpec | None:
    """The captured input structure as a TreeSpec (None if it does not load back: compare text)."""
    try:
        return pytree.treespec_loads(dumped)
    except Exception:  # noqa: BLE001 - a structure pytree cannot load back is compared as text
        return None


def check_batch(batch: Any, spec: ProgramSpec) -> None:
    """Raise :class:`ShapeChanged` when a batch does not match the captured input schema.

    Runs before every step on the chief, so the structure is compared as a TreeSpec (loaded
    once per program) rather than serialised per batch.
    """
    leaves, treespec = pytree.tree_flatten(batch)
    captured = captured_treespec(spec.input_tree)
    same = treespec == captured if captured is not None else pytree.treespec_dumps(treespec) == spec.input_tree
    if not same:
        raise ShapeChanged("the batch's structure (keys/nesting) differs from the first batch's", location=caller_location())
    diffs = []
    for leaf, want in zip(leaves, spec.inputs):
        got_shape = tuple(leaf.shape) if isinstance(leaf, torch.Tensor) else None
        got_dtype = str(leaf.dtype).removeprefix("torch.") if isinstance(leaf, torch.Tensor) else type(leaf).__name__
        if got_shape != tuple(want.shape) or got_dtype != want.dtype:
            diffs.append(f"{want.path}: captured {want.dtype}{list(want.shape)}, got {got_dtype}{list(got_shape or [])}")
    if diffs:
        raise ShapeChanged("a batch's shapes differ from the captured ones: " + "; ".join(diffs), location=caller_location())


def run_checks(*, model: torch.nn.Module, settings: CompileSettings, optimizer: torch.optim.Optimizer | None = None,
               lr_schedulers: Iterable[Any] | None = (), dataloader: Any = None) -> list[CompileError]:
    """All graph-free checks, every problem collected."""
    problems = check_mode(settings)
    if settings.program_mode == "train":
        problems += check_optimizer(optimizer)
        problems += check_lr_schedulers(optimizer, None if lr_schedulers is None else list(lr_schedulers))
        problems += check_lazy_state(optimizer)
        problems += check_batch_norm(model)
    problems += check_precision(model, settings)
    problems += check_dataloader(dataloader)
    return problems
