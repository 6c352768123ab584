"""torch's gradient clipping in a step on the device: the call becomes the program's clipping.

A script clips the way PyTorch does, between ``loss.backward()`` and ``optimizer.step()``::

    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # or clip_grad_value_(..., 0.5)
    optimizer.step()

On the device the weights' gradients exist only inside the step's program, so csrun takes the
call itself: once per process it puts its own ``clip_grad_norm_`` / ``clip_grad_value_`` in
``torch.nn.utils`` (and ``torch.nn.utils.clip_grad``). A call whose parameters are a device
model's goes to that model's driver (:meth:`~csrun.driver.driver.DeviceDriver.clip_gradients`),
which notes it as the step's :class:`Clip` and sends it with the step
(:class:`~csrun.program.step_plan.StepPlan`): the device clips that update's unscaled
gradients after the backward, with torch's arithmetic
(:func:`csrun.program.clipping.clip_gradients`), and ``clip_grad_norm_`` returns the total
norm as a device value (``grad_norm``, readable in a step closure). Steps may clip or not, as
the script says (accumulation: only the update step). Any other call is torch's own.

What the device cannot honour is refused at the call's line: clipping outside ``backward()`` ..
``step()`` or in a step without ``optimizer.step()``, part of the weights,
``error_if_nonfinite=True``, twice in one step, on top of the compile settings' clipping.

A script that bound torch's function before csrun was imported (``from torch.nn.utils import
clip_grad_norm_`` at the top of a module) calls torch's own: in the first step every trainable
weight's ``.grad`` is a :class:`DeviceGradient`, which refuses to be read, so that call (and any
other read of a gradient) stops at its line instead of clipping nothing.
"""

from __future__ import annotations

import math
import os
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

import torch

from csrun.compiler.errors import Location, at
from csrun.compiler.locate import caller_location
from csrun.errors import UserError

NORM = "clip_grad_norm_"
VALUE = "clip_grad_value_"


class ClippingError(UserError):
    """Gradient clipping in a step that the device cannot run as written."""


@dataclass(frozen=True, kw_only=True)
class Clip:
    """The clipping a step asked for."""

    kind: str
    """:data:`NORM` or :data:`VALUE`."""
    limit: float
    """``max_norm`` or ``clip_value``."""
    norm_type: float = 2.0
    location: Location | None = field(default=None, compare=False)
    """The call's line (for refusals at the step's boundary)."""

    def describe(self) -> str:
        """The call as the user wrote it."""
        extra = f", norm_type={self.norm_type:g}" if self.kind == NORM and self.norm_type != 2.0 else ""
        return f"{self.kind}(..., {self.limit:g}{extra})"

    def plan_fields(self) -> dict[str, Any]:
        """The :class:`~csrun.program.step_plan.StepPlan` fields that make the update clip so."""
        if self.kind == NORM:
            return {"max_gradient_norm": self.limit, "gradient_norm_type": self.norm_type}
        return {"max_gradient_value": self.limit}


class ClipTarget(Protocol):
    """What a clipping call on a device model's weights goes to (the driver)."""

    def owns(self, params: list[torch.Tensor]) -> bool:
        """Whether ``params`` are this driver's model's weights."""

    def clip_gradients(self, clip: Clip, params: list[torch.Tensor]) -> Any:
        """Record ``clip`` for the open step; ``clip_grad_norm_``'s result (a device value) or None."""


_TARGETS: "weakref.WeakSet[Any]" = weakref.WeakSet()
_ORIGINAL: dict[str, Callable[..., Any]] = {}


def attach(target: ClipTarget) -> None:
    """Route clipping calls on ``target``'s weights to it (installs csrun's functions once)."""
    _install()
    _TARGETS.add(target)


def _owner(params: list[torch.Tensor]) -> ClipTarget | None:
    if not params:
        return None
    for target in list(_TARGETS):
        if target.owns(params):
            return target
    return None


def _as_list(parameters: Any) -> list[torch.Tensor]:
    return [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)


def clip_grad_norm_(parameters: Any, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: bool | None = None) -> torch.Tensor:
    """torch's ``clip_grad_norm_``; on a device model's weights, the program's clipping (module manual)."""
    params = _as_list(parameters)
    target = _owner(params)
    if target is None:
        return _ORIGINAL[NORM](params, max_norm, norm_type, error_if_nonfinite, foreach)
    if error_if_nonfinite:
        raise ClippingError(f"{at(caller_location())}clip_grad_norm_(error_if_nonfinite=True): the device cannot stop "
                            "in the middle of its step; read the returned norm in a step closure and stop there "
                            "(or use dynamic loss scaling, which skips a step whose gradients are not finite)")
    norm = float(norm_type)
    if not (norm > 0 or math.isinf(norm)):
        raise ClippingError(f"{at(caller_location())}clip_grad_norm_(norm_type={norm_type!r}): give a positive norm "
                            "type or inf")
    return target.clip_gradients(Clip(kind=NORM, limit=_limit(max_norm, "max_norm"), norm_type=norm,
                                      location=caller_location()), params)


def clip_grad_value_(parameters: Any, clip_value: float, foreach: bool | None = None) -> None:
    """torch's ``clip_grad_value_``; on a device model's weights, the program's clipping (module manual)."""
    params = _as_list(parameters)
    target = _owner(params)
    if target is None:
        return _ORIGINAL[VALUE](params, clip_value, foreach)
    target.clip_gradients(Clip(kind=VALUE, limit=_limit(clip_value, "clip_value"), location=caller_location()), params)
    return None


def _limit(value: Any, name: str) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and type(value) is torch.Tensor:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise ClippingError(f"{at(caller_location())}{name}={value!r}: the device clips by a positive number known "
                            "when the step is compiled")
    return float(value)


def torch_clipping(kind: str) -> Callable[..., Any]:
    """torch's own ``clip_grad_norm_`` (:data:`NORM`) or ``clip_grad_value_`` (:data:`VALUE`),
    whatever csrun put in ``torch.nn.utils`` (the check against eager PyTorch clips with it)."""
    import torch.nn.utils.clip_grad as clip_grad_module

    return _ORIGINAL.get(kind) or getattr(clip_grad_module, kind)


def _install() -> None:
    """Put csrun's clipping functions where scripts look them up (once per process)."""
    if _ORIGINAL:
        return
    import torch.nn.utils.clip_grad as clip_grad_module

    _ORIGINAL[NORM] = clip_grad_module.clip_grad_norm_
    _ORIGINAL[VALUE] = clip_grad_module.clip_grad_value_
    for module in (torch.nn.utils, clip_grad_module):
        module.clip_grad_norm_ = clip_grad_norm_  # type: ignore[attr-defined]
        module.clip_grad_value_ = clip_grad_value_  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------
# gradients that are on the device


_META = frozenset({"shape", "dtype", "device", "ndim", "dim", "size", "numel", "requires_grad", "is_leaf",
                   "layout", "is_sparse", "is_cuda", "is_meta", "is_floating_point", "is_complex"})


class DeviceGradient(torch.Tensor):
    """A weight's gradient in the first step on the device: its shape and dtype are here, its
    value only inside the program; reading it is refused at the line that reads it."""

    @staticmethod
    def __new__(cls, weight: torch.Tensor) -> "DeviceGradient":
        return torch.Tensor._make_wrapper_subclass(cls, weight.shape, dtype=weight.dtype, device=weight.device)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name == "__get__":
            owner = getattr(func, "__self__", None)
            name = getattr(owner, "__name__", "") or getattr(getattr(owner, "fget", None), "__name__", "")
        if name in _META:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        raise ClippingError(f"{at(caller_location())}{_gradient_reader()}")

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        raise ClippingError(f"{at(caller_location())}{func} read a weight's gradient, which exists only on the device")


_GRAD_SCALER = os.path.join("torch", "amp", "grad_scaler.py")


def _gradient_reader() -> str:
    """Why a read of a weight's gradient is refused, named by who reads it: torch's GradScaler, an
    optimizer other than the wrapped one, or the script itself."""
    frame = sys._getframe(2)
    while frame is not None:
        own = frame.f_locals.get("self") if frame.f_code.co_name in ("step", "unscale_", "_unscale_grads_") else None
        if frame.f_code.co_filename.endswith(_GRAD_SCALER):
            return ("torch.amp.GradScaler reads the weights' gradients to unscale them, but on the device the loss "
                    "scaling is the device's own and the gradients exist only inside the step's program: use "
                    "cbtorch.amp.GradScaler (cstorch.amp.GradScaler in the 2.x API) or the params' loss scaling "
                    "(loss_scaling_factor), which the device applies")
        if isinstance(own, torch.optim.Optimizer):
            return (f"a second optimizer ({type(own).__module__}.{type(own).__qualname__}) reads the weights' "
                    "gradients in its step(): the device runs one optimizer, the one given to cbtorch.optimizer(...), "
                    "whose update is part of the step's program; put these weights in that optimizer's param groups "
                    "(optimizer.add_param_group) instead of a second optimizer")
        frame = frame.f_back  # type: ignore[assignment]
    return ("this reads a weight's gradient (.grad): on the device the gradients exist only inside the step's program. "
            "Clip with torch.nn.utils.clip_grad_norm_ / clip_grad_value_ looked up after csrun is imported (the "
            "program then clips; a name bound by 'from torch.nn.utils import ...' before importing csrun is torch's "
            "own, which reads the gradients), and read gradient figures in a step closure from what the step returns")


def mark_gradients(weights: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Give each trainable weight without a gradient a :class:`DeviceGradient`; the weights marked."""
    marked = []
    for w in weights:
        if w.requires_grad and w.grad is None:
            w.grad = DeviceGradient(w)
            marked.append(w)
    return marked


def unmark_gradients(weights: Iterable[torch.Tensor]) -> None:
    """Take the :class:`DeviceGradient` marks off again."""
    for w in weights:
        if type(w.grad) is DeviceGradient:
            w.grad = None
