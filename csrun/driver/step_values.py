"""The values of a step on the device path: :class:`StepValue`, its step's state, and reading them.

Every tensor of a step on the device path is a :class:`StepValue` (the recorder's manual,
:mod:`csrun.driver.step_recording`, says how a step is recorded and checked); this module is what
a value is and how it reads.

Values of the step
------------------
The program's outputs are the loss and every device value the user still holds when step 1
ends (model outputs, metrics passed to closures). After the boundary a device value reads its
value from the device **inside a step closure** (as an argument, or captured by the closure);
anywhere else every operation on it (``item``, ``float()``, printing, comparison, indexing,
``cpu``, ``detach`` ...) raises the system's hint (:data:`csrun.emulator.errors.READ_HINT`), and so
does a read while the step is open. A value the compiled step did not keep raises
:class:`ValueNotKept` naming the line that made it. ``.to(device)`` on a value of the open step
is the identity (it is on the system already).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

import torch
import torch.utils._pytree as pytree

from csrun.compiler.errors import Location, at
from csrun.emulator.errors import READ_HINT, DeviceTensorReadError
from csrun.errors import UserError

# --------------------------------------------------------------------------------------------
# errors


class StepChanged(UserError):
    """A step's calls or operations differ from the compiled step's."""

    def __init__(self, what: str, *, compiled: str, location: Location | None) -> None:
        line = f"\n    {location.source_line}" if location is not None and location.source_line else ""
        super().__init__(
            f"{at(location)}this step differs from the compiled one: {what} (compiled: {compiled}).{line}\n"
            "The system runs the step it compiled on the first batch; make every step of the Session "
            "compute the same thing (the same calls, operations and shapes), or start a new Session.")
        self.location = location


class ValueNotKept(UserError):
    """A step value was read that the compiled step does not hand back."""


class StepValueError(UserError):
    """A step value was used in a way the device path cannot run."""


GRAD_NORM = -2
"""The reference of the gradient norm ``clip_grad_norm_`` returns: a value the program's update
computes, not its graph (:data:`ENGINE_OUTPUTS`)."""

ENGINE_OUTPUTS = {GRAD_NORM: "grad_norm"}
"""Step values the engine hands back besides the graph's outputs, by reference."""


# --------------------------------------------------------------------------------------------
# step values


class Recorder(Protocol):
    """What a step value asks of the recorder of its step (:class:`csrun.driver.step_recording.StepRecorder`)."""

    def operation(self, func: Any, name: str, first: "StepValue", args: tuple[Any, ...],
                  kwargs: dict[str, Any], device: bool = True) -> Any:
        """A torch function or tensor method applied to step values."""
        ...

    def consume_input(self, value: "StepValue") -> int:
        """A host value handed to the device: its input number."""
        ...


_STATE = threading.local()


@contextlib.contextmanager
def in_closure() -> Iterator[None]:
    """Step values read their device value inside this block (the step-closure runner uses it)."""
    depth = getattr(_STATE, "closure_depth", 0)
    _STATE.closure_depth = depth + 1
    try:
        yield
    finally:
        _STATE.closure_depth = depth


def inside_closure() -> bool:
    """Whether a step closure is running (:func:`in_closure`)."""
    return getattr(_STATE, "closure_depth", 0) > 0


_METADATA = frozenset({
    "size", "dim", "ndimension", "numel", "nelement", "is_floating_point", "is_complex", "element_size",
    "get_device", "is_contiguous", "stride", "storage_offset", "__len__",
})
_METADATA_PROPERTIES = frozenset({
    "shape", "dtype", "device", "ndim", "is_cuda", "is_sparse", "is_quantized", "is_meta", "layout",
    "requires_grad", "is_leaf", "grad_fn", "names", "itemsize", "nbytes",
})
READS = {
    "item": "call .item() on", "tolist": "call .tolist() on", "numpy": "call .numpy() on",
    "__bool__": "take the truth value of", "__float__": "take float() of", "__int__": "take int() of",
    "__index__": "use as an index", "__format__": "format", "__repr__": "print", "__str__": "print",
    "__array__": "convert to an array", "__reduce_ex__": "pickle", "__deepcopy__": "copy",
    "data_ptr": "take the address of", "untyped_storage": "take the storage of", "__iter__": "iterate over",
}
"""Operations that need a value: refused while the step is open (its values are on the device)."""
DEVICE_MOVES = frozenset({"to", "cuda", "cpu"})
"""On a step value that belongs to an open step, ``.to(device)`` is the identity (the value
is on the system already); a ``.to(dtype)`` is recorded."""


def _func_name(func: Any) -> str:
    name = getattr(func, "__name__", "")
    if name == "__get__":
        owner = getattr(func, "__self__", None)
        name = getattr(owner, "__name__", "") or getattr(getattr(owner, "fget", None), "__name__", "")
    return name


_KINDS: dict[Any, tuple[str, str]] = {}


def _kind(func: Any) -> tuple[str, str]:
    """(kind, name) of a torch function: ``meta`` (shape, dtype ...: answered here) or ``op``; cached."""
    try:
        return _KINDS[func]
    except (KeyError, TypeError):
        pass
    name = _func_name(func)
    kind = ("meta", name) if name in _METADATA_PROPERTIES or name in _METADATA else ("op", name)
    try:
        _KINDS[func] = kind
    except TypeError:  # an unhashable callable: not cached
        pass
    return kind


class _Scan:
    """One walk over (nested) arguments: the first step value, and whether any is a device value."""

    __slots__ = ("first", "device")

    def __init__(self) -> None:
        self.first: StepValue | None = None
        self.device = False

    def walk(self, x: Any) -> None:
        if isinstance(x, StepValue):
            if self.first is None:
                self.first = x
            if not x._host:
                self.device = True
        elif isinstance(x, (list, tuple)):
            for v in x:
                self.walk(v)
        elif isinstance(x, dict):
            for v in x.values():
                self.walk(v)


class StepValue(torch.Tensor):
    """A tensor of a step on the device: shape and dtype here, the value on the device (module manual)."""

    _recorder: Recorder
    _ref: int
    _step: "StepState"
    _value: torch.Tensor | None
    _host: bool
    _slot: int | None

    @staticmethod
    def __new__(cls, recorder: Recorder, step: "StepState", ref: int, shape: torch.Size,
                dtype: torch.dtype, value: torch.Tensor | None = None, *, host: bool = False) -> "StepValue":
        out = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=torch.device("cpu"), requires_grad=False)
        out._recorder = recorder
        out._step = step
        out._ref = ref
        out._value = value
        out._host = host
        out._slot = None
        return out

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        kind, name = _kind(func)
        if kind == "meta":
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        found = _Scan()
        found.walk(args)
        if kwargs:
            found.walk(kwargs)
        first = found.first
        if first is None:  # e.g. a torch function that got a step value's type only
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        return first._recorder.operation(func, name, first, args, kwargs, found.device)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        raise StepValueError(
            f"{func} reached a step value below torch's Python layer; step values take torch functions "
            "and tensor methods (csrun records them) — please report this with the line that made it")


@dataclass(eq=False)
class StepState:
    """One step's values: open (recording or checking) until the boundary, then closed."""

    number: int
    open: bool = True
    inputs: tuple[torch.Tensor, ...] = ()
    """After the boundary: the program's inputs (what is sent to the device)."""
    input_leaves: tuple[int, ...] = ()
    """After the boundary: for each input, its index among the batch's flattened leaves (-1: a
    value the step computed on the host), so another batch's inputs can be taken alike."""
    output_names: dict[int, str] | None = None
    """After the boundary: value number -> the program's output name (the step's recording's)."""
    value_lines: dict[int, Location | None] = field(default_factory=dict)
    """After the boundary: the line that made each value (for a read of one not kept)."""
    outputs: Callable[[], dict[str, torch.Tensor]] | None = None
    """After the step was sent: its outputs as CPU tensors by name (waits for the device)."""


def read_value(value: StepValue) -> torch.Tensor:
    """The value of a step value of a closed step: the batch's own, or the device's output (waits
    for the device); refused before the step was sent, or for a value the compiled step does not keep."""
    step = value._step
    if value._host:
        return value._value  # type: ignore[return-value]
    if step.outputs is None or step.output_names is None:
        raise DeviceTensorReadError(f"step {step.number} has not been sent to the device yet: {READ_HINT}")
    name = step.output_names.get(value._ref) or ENGINE_OUTPUTS.get(value._ref)
    if name is None:
        loc = step.value_lines.get(value._ref)
        where = f" (made at {loc.filename}:{loc.lineno}: {loc.source_line})" if loc is not None else ""
        raise ValueNotKept(f"this step value{where} is not one the compiled step hands back: the step keeps the loss, "
                           "the model's outputs and the values still held when the first step ended; keep a "
                           "reference to it (e.g. pass it to the step closure) in the first step too")
    return step.outputs()[name]


def value_of(x: Any) -> Any:
    """``x`` with every closed step value replaced by its value (for closure arguments)."""
    def one(v: Any) -> Any:
        if isinstance(v, StepValue):
            return read_value(v)
        return v

    return pytree.tree_map(one, x)


def cpu_values(x: Any) -> Any:
    """Step values -> their CPU values (the batch's, or step 1's shape run's)."""
    def one(v: Any) -> Any:
        if isinstance(v, StepValue):
            if v._value is None:
                raise StepValueError("a step value without a CPU value while recording (csrun bug)")
            return v._value
        return v

    return pytree.tree_map(one, x)
