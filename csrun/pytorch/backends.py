"""``cstorch.backend(...)`` and ``cstorch.compile(model, backend)``: where a 2.x script's steps run.

A :class:`Backend` is the 2.x face of :func:`csrun.torch.initialize`: ``"CSX"`` takes the
device path (the embedded emulator, or the ``cs_emulator`` at ``cs_ip`` / ``CS_IP``;
``compile_only`` / ``validate_only`` compile at the first step's end and exit; launched by
``csrun_cpu`` without a ``cs_ip`` it is the validation run, eager on the CPU), ``"CPU"`` runs
eagerly (``initialize(cpu=True)``, even under ``CS_IP`` or ``csrun_wse``). One backend per
process: creating a second one of another kind is refused. :func:`compile` wraps the model
with ``cbtorch.module`` (the driver's whole-step capture on the device).

Half precision follows 2.2.1: :func:`csrun.pytorch.amp.set_half_dtype` chooses the 16-bit
type (float16 by default; ``torch.bfloat16``; ``"cbfloat16"``), ``mixed_precision`` is the
switch. ``cstorch.backend("CPU", mixed_precision=True)`` runs each traced step under bfloat16
autocast, as 2.2.1's CPU backend does (another half type is refused there);
``cstorch.backend("CSX", mixed_precision=True)`` makes the device compute in the half type.
Without it the device computes float32, whatever the half type (2.2.1's flow never passes
``mixed_precision`` to the CSX backend: the system chose by ``precision_opt_level``, csrun
computes the graph as written, so a float32 script gets the CPU's float32 numbers).

The device's training settings a 2.x script states in Python — the half type and the switch,
the loss scaling (``amp.GradScaler``) and the
schedule (``optim.lr_scheduler``) — are collected in one :class:`TrainingSettings` (process-wide, so they may be stated before the
backend exists) and handed to the driver as its :class:`~csrun.compiler.CompileSettings` until
the first step compiles; a change after that is refused (:class:`SettingsChangedError`): the
program on the device has them built in. On the CPU nothing is handed over: the eager loop
applies them itself (:mod:`csrun.pytorch.amp`, :mod:`csrun.pytorch.optim.lr_scheduler`).
Clipping (``amp.optimizer_step(max_gradient_norm=...)``) is each step's own, as torch's
``clip_grad_norm_`` in a cbtorch loop is (:mod:`csrun.driver.clipping`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

import csrun.torch as cbtorch
from csrun.cluster import cluster_info
from csrun.compiler.settings import CompileSettings
from csrun.compiler.spec import LossScalingSpec
from csrun.driver.run_path import RunPath
from csrun.errors import UserError
from csrun.driver.driver import DeviceDriver
from csrun.driver.driver import SettingsChangedError as CompiledWithOthers

class BackendType(str, enum.Enum):
    """The backend types: the wafer emulator, or eager PyTorch on the CPU (equal to their names)."""

    CSX = "CSX"
    CPU = "CPU"

    def __str__(self) -> str:
        return self.value


BACKEND_TYPES: tuple[str, ...] = tuple(t.value for t in BackendType)
"""The backend type names."""

CPU_LAUNCHER = "csrun_cpu"
"""Under this launcher a ``"CSX"`` script is the validation run: eager on the CPU (unless ``cs_ip`` is given)."""

HalfDtype = Literal["float16", "bfloat16", "cbfloat16"]
"""The 16-bit types (on the device ``bfloat16`` runs as ``cbfloat16``)."""


class BackendError(UserError):
    """A backend asked for something csrun cannot do, or a step run without one."""


class SettingsChangedError(CompiledWithOthers):
    """A training setting changed after the step was compiled with the old one."""


@dataclass(kw_only=True)
class TrainingSettings:
    """What the device builds into the program besides the graph (the 2.x script states it in Python)."""

    half_dtype: HalfDtype | None = "float16"
    """The 16-bit type (``amp.set_half_dtype``; None: float32 even with mixed precision on)."""
    mixed_precision: bool = False
    """The switch: the device computes in :attr:`half_dtype` (``backend(..., mixed_precision=True)``)."""
    loss_scaling: LossScalingSpec = field(default_factory=LossScalingSpec)
    """From the last ``amp.GradScaler`` built (default: no scaling)."""
    learning_rate: Any = 0.0
    """The legacy schedule of the last ``optim.lr_scheduler`` built (0.0: the optimizer's lr)."""

    def compile_settings(self) -> CompileSettings:
        """These settings as the compiler takes them (the optimizer comes from the wrapped one)."""
        half = self.half_dtype if self.mixed_precision else None
        return CompileSettings(mixed_precision=half is not None,
                               use_cbfloat16=half in ("bfloat16", "cbfloat16"), loss_scaling=self.loss_scaling,
                               learning_rate=self.learning_rate)


_settings = TrainingSettings()
_current: "Backend | None" = None


def training_settings() -> TrainingSettings:
    """The process's training settings (a copy: change them with :func:`update_settings`)."""
    return replace(_settings)


def update_settings(**changes: Any) -> None:
    """Change training settings (``TrainingSettings`` field names) and hand them to the device."""
    global _settings
    new = replace(_settings, **changes)
    if _current is not None:
        _current.apply_settings(new)
    _settings = new


@dataclass
class DeviceConfig:
    """``backend.device.config``: how the system builds the model's weights (accepted, see below)."""

    lazy_initialization: bool = True
    """The system initialised weights on the appliance; csrun's are the CPU model's, built eagerly."""
    drop_data: bool = False
    """The system dropped the weights' values when only compiling; csrun's compile reads shapes."""


class Device:
    """``backend.device``: the context the model's weights are created under.

    On the system, weights made under it are created lazily on the appliance. Here the CPU
    copy is the model; the device gets the weights when the first step compiles, so the
    context only marks where the script means them to live.
    """

    def __init__(self, backend_type: BackendType) -> None:
        self.type: BackendType = backend_type
        """``"CSX"`` or ``"CPU"``."""
        self.torch_device = torch.device("cpu")
        """Where the model's tensors are (always the CPU copy)."""
        self.config = DeviceConfig()
        """Weight-building settings (accepted; see :class:`DeviceConfig`)."""

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __repr__(self) -> str:
        return f"cstorch device {self.type.value}"


@dataclass(frozen=True, kw_only=True)
class BackendOptions:
    """What ``cstorch.backend(...)`` was told."""

    backend_type: BackendType
    """``"CSX"`` or ``"CPU"``."""
    artifact_dir: str | None = None
    """Where compiles go (``cs_<hash>/`` folders; the cbtorch ``model_dir``)."""
    compile_dir: str | None = None
    """One explicit compile folder (overrides ``artifact_dir/cs_<hash>``)."""
    compile_only: bool = False
    """Compile at the end of the first step and exit (0: compiled, 1: not)."""
    validate_only: bool = False
    """Capture and check at the end of the first step and exit."""
    cs_ip: str | None = None
    """``HOST[:PORT]`` of a ``cs_emulator``; None: ``CS_IP``, else the embedded emulator."""
    emulator_device: str = "cpu"
    """The embedded emulator's torch device (``cpu``, ``cuda``, ``cuda:<i>``)."""
    queue_depth: int = 2
    """Steps the chief may run ahead of the device."""
    mixed_precision: bool | None = None
    """The half-precision switch (None: as the settings have it; see the module manual)."""
    retrace_every_iteration: bool = False
    """Accepted: csrun records every step and checks it against the compiled one either way."""


class Backend:
    """A 2.x backend: the run path, the device context and the compiled model (see the module manual)."""

    def __init__(self, options: BackendOptions) -> None:
        self.options = options
        self.backend_type: BackendType = options.backend_type
        """``"CSX"`` (the wafer emulator) or ``"CPU"`` (eager PyTorch)."""
        self.is_csx = options.backend_type == "CSX"
        """True for the wafer emulator."""
        self.is_cpu = not self.is_csx
        """True for eager PyTorch."""
        self.is_gpu = False
        """False: csrun has no GPU backend (the emulator may run on one: ``device="cuda"``)."""
        self.device = Device(options.backend_type)
        """The context manager the model is built under."""
        self.model: torch.nn.Module | None = None
        """The model :func:`compile` wrapped."""
        info = cluster_info()
        validating = info.launcher == CPU_LAUNCHER and options.cs_ip is None
        csx = self.is_csx and not validating
        cs_ip = options.cs_ip
        if csx and cs_ip is None and not info.cs_ip:
            cs_ip = "embedded"  # "CSX" means the device even under plain python
        self.state = cbtorch.initialize(cs_ip if csx else None, cpu=not csx, compile_only=options.compile_only,
                                        validate_only=options.validate_only,
                                        model_dir=options.artifact_dir, compile_dir=options.compile_dir,
                                        device=options.emulator_device, queue_depth=options.queue_depth)
        self.apply_settings(_settings)  # the one hand-over, on the device and on the CPU (TrainingRules)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype a CPU run's traced steps autocast to (bfloat16 with mixed precision; None: float32)."""
        if self.on_device or not _settings.mixed_precision or self.backend_type != BackendType.CPU:
            return None
        return torch.bfloat16

    @property
    def run_path(self) -> RunPath:
        """The chief's path (embedded, remote, compile_only, validate_only or cpu)."""
        return self.state.options.path

    @property
    def on_device(self) -> bool:
        """True when this task's steps run on the emulator (the chief on a device path)."""
        return isinstance(self.state.backend, DeviceDriver)

    def apply_settings(self, settings: TrainingSettings) -> None:
        """Hand ``settings`` to the backend (refused once the step is compiled with others; on the
        CPU the eager backend runs their schedule)."""
        try:
            self.state.backend.apply_settings(settings.compile_settings())
        except CompiledWithOthers:
            changed = [k for k in TrainingSettings.__dataclass_fields__
                       if getattr(settings, k) != getattr(_settings, k)]
            raise SettingsChangedError(f"{', '.join(changed) or 'a training setting'} changed after the step was "
                                       f"compiled: set it before the first step and keep it for the run") from None

    def __repr__(self) -> str:
        return f"cstorch.backend({self.backend_type.value!r}, path={self.run_path.kind})"


def current_backend() -> Backend | None:
    """The backend this process created (None before ``cstorch.backend`` / ``cstorch.compile``)."""
    return _current


def require_backend(what: str) -> Backend:
    """The current backend, or a :class:`BackendError` saying ``what`` needs one."""
    if _current is None:
        raise BackendError(f"{what} needs a backend: create it first with cstorch.backend('CSX') (or 'CPU'), "
                           f"or cstorch.compile(model, 'CSX')")
    return _current


def backend(backend_type: str = "CSX", *, artifact_dir: str | None = None, compile_dir: str | None = None,
            compile_only: bool = False, validate_only: bool = False, cs_ip: str | None = None,
            device: str = "cpu", queue_depth: int = 2, mixed_precision: bool | None = None,
            retrace_every_iteration: bool = False, **kwargs: Any) -> Backend:
    """Create this process's backend: ``"CSX"`` (the wafer emulator) or ``"CPU"`` (eager).

    ``artifact_dir``: where compiles go; ``compile_dir``: one explicit compile folder;
    ``compile_only`` / ``validate_only``: compile (or check) at the end of the first step and
    exit; ``cs_ip``: a ``cs_emulator``'s ``HOST[:PORT]`` (default ``CS_IP``, else embedded);
    ``device``: the embedded emulator's torch device; ``queue_depth``: steps run ahead;
    ``mixed_precision``: the half-precision switch (see the module manual);
    ``retrace_every_iteration``: accepted (every step is checked against the compiled one).
    Calling it again with the same arguments returns the same backend.
    """
    global _current
    kind = str(backend_type.value if isinstance(backend_type, BackendType) else backend_type).upper()
    if kind == "GPU":
        raise BackendError("cstorch.backend('GPU'): csrun has no GPU backend; run 'CSX' (the wafer emulator, "
                           "which runs on a GPU with device='cuda') or 'CPU' (eager PyTorch)")
    if kind not in BACKEND_TYPES:
        raise BackendError(f"cstorch.backend({backend_type!r}): the backend types are 'CSX' (the wafer emulator) "
                           f"and 'CPU' (eager PyTorch)")
    if kwargs:
        raise BackendError(f"cstorch.backend({kind!r}, {', '.join(f'{k}=...' for k in sorted(kwargs))}): not an "
                           f"argument csrun's backend takes (artifact_dir, compile_dir, compile_only, validate_only, "
                           f"cs_ip, device, queue_depth, mixed_precision, retrace_every_iteration)")
    if mixed_precision is not None and not isinstance(mixed_precision, bool):
        raise BackendError(f"cstorch.backend({kind!r}, mixed_precision={mixed_precision!r}): give True or False")
    if kind == "CPU" and (compile_only or validate_only):
        raise BackendError("cstorch.backend('CPU', compile_only/validate_only=True): compiling is for the 'CSX' "
                           "backend; use cstorch.backend('CSX', compile_only=True)")
    if kind == "CPU" and cs_ip is not None:
        raise BackendError(f"cstorch.backend('CPU', cs_ip={cs_ip!r}): a cs_ip is for the 'CSX' backend")
    options = BackendOptions(backend_type=BackendType(kind), artifact_dir=artifact_dir, compile_dir=compile_dir,
                             compile_only=bool(compile_only), validate_only=bool(validate_only), cs_ip=cs_ip,
                             emulator_device=device, queue_depth=queue_depth, mixed_precision=mixed_precision,
                             retrace_every_iteration=bool(retrace_every_iteration))
    if _current is not None:
        if _current.options == options:
            return _current
        raise BackendError(f"a backend already exists ({_current!r}); a process has one: create it once, "
                           f"before the model, and pass it to cstorch.compile")
    if kind == "CPU" and mixed_precision and _settings.half_dtype != "bfloat16":
        raise BackendError(f"cstorch.backend('CPU', mixed_precision=True) with half dtype {_settings.half_dtype}: "
                           f"mixed precision on the CPU is bfloat16 autocast; call "
                           f"cstorch.amp.set_half_dtype(torch.bfloat16) first")
    if mixed_precision is not None:
        update_settings(mixed_precision=mixed_precision)
    _current = Backend(options)
    return _current


def compile(model: torch.nn.Module, backend: Backend | str = "CSX") -> torch.nn.Module:  # noqa: A001 - the 2.x name
    """The model as the backend runs it (``backend`` may be a type name: ``"CSX"`` / ``"CPU"``).

    On the device its calls in a traced step are captured and compiled with the step; its
    ``state_dict()`` and parameters show the device's values. One model per backend.
    """
    if not isinstance(model, torch.nn.Module):
        raise BackendError(f"cstorch.compile needs a torch.nn.Module, got {type(model).__name__}")
    be = backend if isinstance(backend, Backend) else _backend_named(backend)
    if be.model is not None:
        if be.model is model:
            return model
        raise BackendError("cstorch.compile: this backend already runs a model; a run compiles one model")
    be.model = cbtorch.module(model)
    return be.model


def _backend_named(name: Any) -> Backend:
    if not isinstance(name, str):
        raise BackendError(f"cstorch.compile(model, backend): give a cstorch.backend(...) or 'CSX' / 'CPU', "
                           f"got {type(name).__name__}")
    if _current is not None and _current.backend_type == name.upper():
        return _current
    return backend(name)


def reset_for_tests() -> None:
    """Forget the backend and the training settings (unit tests only; pair with cbtorch's reset)."""
    global _current, _settings
    _current = None
    _settings = TrainingSettings()
