"""``cerebras.framework.torch`` as R1.6 had it, where csrun's own names differ.

- :func:`initialize` takes R1.6's keywords (``service_workdir``, ``compile_dir``, ``cs_ip``,
  ``compile_only``, ``appliance``, ``use_cbfloat16``); the zoo passes ``compile_only=True`` for
  ``--validate_only`` too and says which at :func:`compile`. A ``cs_ip`` of ``embedded`` (the zoo
  appends ``:9000``) is the embedded emulator.
- :func:`compile` (``fabric_config_file``, ``validate_only``): compile, or only validate, the step
  the loop ran on a compile-only run, and return whether it passed (R1.6 compiled here).
- :func:`env`: ``weight_streaming_mode``, ``appliance``, ``service_workdir``.
- :func:`optimizer`: the optimizer as R1.6's wrapper showed it: an instance of
  :class:`optim.Optimizer <Optimizer>`, with ``_optimizer`` (the torch optimizer under the
  wrapper: copies of its param groups over the same weights, so a torch scheduler built on it,
  as the zoo builds its ``LambdaLR`` beside the device's schedule, changes no update; its
  ``step()`` does nothing, the device updates), ``convert_state_dict_for_checkpoint`` (as it is, unless the
  optimizer defines its own), and a ``gradient_clipper`` slot: the zoo's ``GradientClipper``
  assigned there (``max_gradient`` with ``clip_grad_norm_`` or ``clip_grad_value_``; one that stood
  down for the scaler's norm does nothing) becomes the compile's clipping, as R1.6's wrapper applied it
  in ``step()``; ``set_main_lr_scheduler`` is weight streaming's.
- ``optim.lr_scheduler.{Constant, Polynomial, Exponential, InverseExponentialTimeDecay,
  CosineDecay, MultiStep, Step, CosineAnnealing}(optimizer, ...)`` with R1.6's positional
  arguments: each is one segment of the device's schedule, in the order built (the zoo builds a
  list's segments one after another, each ``decay_steps`` long), handed over as the compile's
  ``learning_rate``; ``Lambda`` and ``disable_lr_steps_reset=True`` refuse.
- ``data.DataLoader`` and ``utils.data.dataloader.DataLoader`` are csrun's streaming loader
  (:class:`~csrun.torch.dataloader.StreamingDataLoader`); ``nn.StripPadding``,
  ``utils.nest.{visit,map}_xla_tensors`` and ``core.appliance.ApplianceMode`` import and refuse
  (:mod:`csrun.torch.r1.unsupported`).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Iterator

import torch

from csrun.driver.driver import DeviceDriver
from csrun.program.schedules import build_schedule
from csrun.torch import optimizer as csrun_optimizer
from csrun.torch.dataloader import StreamingDataLoader
from csrun.torch.process_state import State, state
from csrun.torch.process_state import initialize as csrun_initialize
from csrun.torch.r1 import settings
from csrun.torch.r1.unsupported import refuse, unsupported, unsupported_class

_PREPARED = "_csrun_r1_prepared"
_APPLIANCE = "appliance mode is the R1.7+ flow; csrun runs the pipelined mode (leave --appliance out)"
_WEIGHT_STREAMING = "weight streaming's optimizer hooks are not R1.6 pipelined mode"


@dataclass(frozen=True, kw_only=True)
class Env:
    """``cbtorch.env()``."""

    weight_streaming_mode: bool = False
    """False: the pipelined mode (R1.6's weight streaming is csrun's ``CSRUN_EXECUTION_STRATEGY``)."""
    appliance: bool = False
    """False: csrun has no appliance mode."""
    service_workdir: str = "."
    """Where the run writes (``initialize(service_workdir=...)``, else the model_dir)."""


def initialize(service_workdir: str | None = None, compile_dir: str | None = None, cs_ip: str | None = None,
               compile_only: bool | None = False, appliance: bool | None = False,
               use_cbfloat16: bool | None = False) -> State:
    """R1.6's ``cbtorch.initialize`` (see the module manual); returns csrun's state."""
    if appliance:
        refuse("cbtorch.initialize(appliance=True)", _APPLIANCE)
    if cs_ip is not None and str(cs_ip).split(":", 1)[0].strip().lower() == "embedded":
        cs_ip = "embedded"
    if compile_dir is not None and service_workdir is not None and \
            os.path.abspath(compile_dir) == os.path.abspath(service_workdir):
        compile_dir = None  # the zoo's default: the compiles go in the model_dir, each in its cs_<hash>
    st = csrun_initialize(cs_ip, compile_only=bool(compile_only), model_dir=service_workdir,
                          compile_dir=compile_dir)
    settings.update(use_cbfloat16=bool(use_cbfloat16))
    return st


def compile(fabric_config_file: str | None = None, validate_only: bool = False) -> bool:  # noqa: A001 - R1.6's name
    """Compile (or only validate) the step the loop ran; True when it passed (see the module manual)."""
    backend = state().backend
    if not isinstance(backend, DeviceDriver):
        refuse("cbtorch.compile() on the CPU", "run with --compile_only or --validate_only")
    if fabric_config_file:
        refuse(f"cbtorch.compile(fabric_config_file={fabric_config_file!r})",
               "a fabric file describes a physical system; the emulator has its own (leave it out)")
    return backend.compile_step(validate=bool(validate_only))


def env() -> Env:
    """What R1.6's ``cbtorch.env()`` said about this run."""
    model_dir = state().options.model_dir
    return Env(service_workdir=str(model_dir) if model_dir else ".")


class _PreparedMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return bool(getattr(obj, _PREPARED, False))


class Optimizer(metaclass=_PreparedMeta):
    """``cbtorch.optim.Optimizer``: what :func:`optimizer` returned (``isinstance`` is True for it)."""


def _as_it_is(state_dict: dict[str, Any]) -> dict[str, Any]:
    return state_dict


class _Underlying(torch.optim.Optimizer):
    """``optimizer._optimizer``: copies of the wrapped optimizer's param groups (the same weights)
    and its state; what a scheduler writes into them changes no update; ``step()`` does nothing."""

    def __init__(self, wrapped: torch.optim.Optimizer) -> None:
        super().__init__([torch.zeros(0, requires_grad=True)], {})
        self.param_groups = [dict(group) for group in wrapped.param_groups]
        self.state, self.defaults = wrapped.state, wrapped.defaults

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """Nothing: the device runs the update."""


def _clipper(opt: Any) -> Any:
    return opt.__dict__.get("_csrun_r1_gradient_clipper")


def _set_clipper(opt: Any, clipper: Any) -> None:
    """The zoo's ``GradientClipper`` becomes the compile's clipping (the device clips in the update)."""
    opt.__dict__["_csrun_r1_gradient_clipper"] = clipper
    fn = getattr(clipper, "max_gradient_fn", None)
    limit = getattr(clipper, "max_gradient", 0.0)
    if fn is None or not limit:
        return  # no clipping, or the GradScaler's max_gradient_norm clips instead
    kind = getattr(fn, "__name__", "")
    if kind == "clip_grad_norm_":
        settings.update(max_gradient_norm=float(limit), max_gradient_value=None)
    elif kind == "clip_grad_value_":
        settings.update(max_gradient_value=float(limit), max_gradient_norm=None)
    else:
        refuse(f"optimizer.gradient_clipper with {kind or fn!r}", "the device clips by global norm or by value "
               "(torch.nn.utils.clip_grad_norm_ / clip_grad_value_)")


_WITH_SLOT: dict[type, type] = {}


def _with_clipper_slot(opt: torch.optim.Optimizer) -> None:
    """Give ``opt`` a ``gradient_clipper`` slot (its class, with that one property added)."""
    cls = type(opt)
    if isinstance(cls.__dict__.get("gradient_clipper"), property):
        return
    slotted = _WITH_SLOT.get(cls)
    if slotted is None:
        slotted = type(cls.__name__, (cls,), {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                              "gradient_clipper": property(_clipper, _set_clipper)})
        _WITH_SLOT[cls] = slotted
    opt.__class__ = slotted


def optimizer(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """R1.6's ``cbtorch.optimizer``: csrun's, showing the wrapper's attributes (module manual)."""
    prepared = csrun_optimizer(opt)
    setattr(prepared, _PREPARED, True)
    _with_clipper_slot(prepared)
    if not hasattr(prepared, "_optimizer"):
        prepared._optimizer = _Underlying(prepared)  # type: ignore[attr-defined]
    if not hasattr(prepared, "convert_state_dict_for_checkpoint"):
        prepared.convert_state_dict_for_checkpoint = _as_it_is  # type: ignore[attr-defined]
    if not hasattr(prepared, "set_main_lr_scheduler"):
        prepared.set_main_lr_scheduler = unsupported(  # type: ignore[attr-defined]
            "cbtorch.optimizer(...).set_main_lr_scheduler", _WEIGHT_STREAMING)
    return prepared


@contextlib.contextmanager
def name_scope(name: str) -> Iterator[None]:
    """``core.name_scope``: names the operations inside for the system's compiler; csrun's
    compile does not use the names, so the block runs as it is."""
    yield


_SEGMENT_KEYS: dict[str, tuple[str, ...]] = {
    "Constant": ("learning_rate", "steps"),
    "Polynomial": ("initial_learning_rate", "end_learning_rate", "decay_steps", "power", "cycle"),
    "Exponential": ("initial_learning_rate", "decay_steps", "decay_rate", "staircase"),
    "InverseExponentialTimeDecay": ("initial_learning_rate", "step_exponent", "decay_steps", "decay_rate",
                                    "staircase"),
    "CosineDecay": ("initial_learning_rate", "end_learning_rate", "decay_steps"),
    "MultiStep": ("learning_rate", "gamma", "milestones"),
    "Step": ("learning_rate", "gamma", "step_size"),
    "CosineAnnealing": ("learning_rate", "t_max", "eta_min"),
}
"""R1.6's device-side scheduler -> the legacy ``learning_rate`` keys of its positional arguments."""
_segments: list[dict[str, Any]] = []


def _lr_scheduler(name: str) -> Any:
    keys = _SEGMENT_KEYS[name]

    def build(optimizer: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        values = dict(zip(keys + ("disable_lr_steps_reset",), args))
        values.update(kwargs)
        if values.pop("disable_lr_steps_reset", False):
            refuse(f"cbtorch.optim.lr_scheduler.{name}(disable_lr_steps_reset=True)",
                   "each segment of the device's schedule counts its steps from its own start")
        segment = {"scheduler": name, **{k: v for k, v in values.items() if v is not None}}
        build_schedule(segment)  # a bad value fails here, naming it
        _segments.append(segment)
        settings.update(learning_rate=_segments[0] if len(_segments) == 1 else list(_segments))
        return segment

    build.__name__ = build.__qualname__ = name
    build.__doc__ = f"R1.6's device-side ``{name}`` schedule segment (module manual)."
    return build


def reset_for_tests() -> None:
    """Forget the schedule segments (tests only)."""
    _segments.clear()

data = SimpleNamespace(DataLoader=StreamingDataLoader)
"""``cbtorch.data``."""
optim = SimpleNamespace(
    Optimizer=Optimizer,
    lr_scheduler=SimpleNamespace(
        Lambda=unsupported("cbtorch.optim.lr_scheduler.Lambda", "an arbitrary Python function of the step is not "
                           "a device schedule; use one of the named schedulers"),
        **{n: _lr_scheduler(n) for n in _SEGMENT_KEYS}))
"""``cbtorch.optim``."""
nn = SimpleNamespace(StripPadding=unsupported_class(
    "cbtorch.nn.StripPadding", "variable tensor shapes are a system kernel; set model.enable_vts: False"))
"""``cbtorch.nn``."""
def extract_loss(model_outputs: Any) -> Any:
    """``cbtorch.utils.extract_loss``: the loss in a model's outputs (the tensor itself, the first of a
    tuple or list, or its ``loss`` attribute); anything else is a ``TypeError``, as in R1.6."""
    if isinstance(model_outputs, torch.Tensor):
        return model_outputs
    if isinstance(model_outputs, (list, tuple)) and model_outputs:
        return model_outputs[0]
    if hasattr(model_outputs, "loss"):
        return model_outputs.loss
    raise TypeError(f"Invalid outputs type: {type(model_outputs)}.")


utils = SimpleNamespace(
    extract_loss=extract_loss,
    data=SimpleNamespace(dataloader=SimpleNamespace(DataLoader=StreamingDataLoader)),
    nest=SimpleNamespace(
        visit_xla_tensors=unsupported("cbtorch.utils.nest.visit_xla_tensors", _APPLIANCE),
        map_xla_tensors=unsupported("cbtorch.utils.nest.map_xla_tensors", _APPLIANCE)))
"""``cbtorch.utils``."""
appliance = SimpleNamespace(ApplianceMode=unsupported_class("cbtorch.core.appliance.ApplianceMode", _APPLIANCE))
"""``cbtorch.core.appliance``."""
