"""Step handles and device tensors: values that exist only once a step has run on the device.

:class:`StepHandle` is returned by ``Device.submit`` at once; it resolves to the step's outputs
as CPU tensors at the step boundary (:meth:`StepHandle.result`). ``handle["loss"]`` is a
:class:`DeviceTensor`: reading its value (``.item()``, ``float()``, ``bool()``, printing,
arithmetic) is refused with the system's hint to use a step closure. The step-closure machinery
reads it with :meth:`DeviceTensor.resolve`, at the boundary.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, NoReturn

import torch

from csrun.emulator.errors import READ_HINT, DeviceTensorReadError


class StepHandle:
    """The pending outputs of one submitted step."""

    def __init__(self, step: int, future: "Future[dict[str, torch.Tensor]]") -> None:
        self.step = step
        """1-based index of the step in submission order on this device."""
        self._future = future

    def done(self) -> bool:
        """True when the step has finished (successfully or not)."""
        return self._future.done()

    def result(self, timeout: float | None = None) -> dict[str, torch.Tensor]:
        """Wait for the step boundary; return the outputs as CPU tensors.

        Raises :class:`~csrun.emulator.errors.StepFailed` (or ``LinkLost``) if the step failed.
        """
        return self._future.result(timeout)

    def __getitem__(self, name: str) -> "DeviceTensor":
        return DeviceTensor(self, name)

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<StepHandle step={self.step} {state}>"


def _refuse(what: str) -> NoReturn:
    raise DeviceTensorReadError(f"cannot {what} a device tensor here: {READ_HINT}")


class DeviceTensor:
    """A named output of a step that may not have run yet; its value is read in a step closure."""

    __slots__ = ("_handle", "_name")

    def __init__(self, handle: StepHandle, name: str) -> None:
        self._handle = handle
        self._name = name

    @property
    def name(self) -> str:
        """The output's name (``loss``, ``lr``, ``loss_scale`` or an extra output)."""
        return self._name

    @property
    def step(self) -> int:
        """The step this tensor belongs to."""
        return self._handle.step

    def resolve(self, timeout: float | None = None) -> torch.Tensor:
        """The value as a CPU tensor, waiting for the step boundary (for step-closure machinery)."""
        out = self._handle.result(timeout)
        if self._name not in out:
            raise KeyError(f"step {self.step} has no output {self._name!r}; outputs: {sorted(out)}")
        return out[self._name]

    def item(self) -> NoReturn:
        """Refused: read values in a step closure."""
        _refuse("call .item() on")

    def tolist(self) -> NoReturn:
        """Refused: read values in a step closure."""
        _refuse("call .tolist() on")

    def numpy(self) -> NoReturn:
        """Refused: read values in a step closure."""
        _refuse("call .numpy() on")

    def __float__(self) -> NoReturn:
        _refuse("take float() of")

    def __int__(self) -> NoReturn:
        _refuse("take int() of")

    def __index__(self) -> NoReturn:
        _refuse("use as an index")

    def __bool__(self) -> NoReturn:
        _refuse("take the truth value of")

    def __repr__(self) -> str:
        _refuse("print")

    def __str__(self) -> str:
        _refuse("print")

    def __format__(self, spec: str) -> str:
        _refuse("format")

    def __array__(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("convert to an array")

    def __len__(self) -> int:
        _refuse("take len() of")

    def __iter__(self) -> NoReturn:
        _refuse("iterate over")

    def __hash__(self) -> int:
        return id(self)


def _arith(op: str) -> Any:
    def method(self: DeviceTensor, *args: Any) -> NoReturn:
        _refuse(f"do arithmetic ({op}) on")

    method.__name__ = op
    return method


for _op in (
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__", "__matmul__",
    "__rmatmul__", "__neg__", "__pos__", "__abs__", "__lt__", "__le__", "__gt__", "__ge__", "__round__",
    "__iadd__", "__isub__", "__imul__", "__itruediv__",
):
    setattr(DeviceTensor, _op, _arith(_op))
