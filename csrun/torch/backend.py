"""The device seam: what a Session asks of the thing that runs the steps.

The user API never runs a step itself; it calls a :class:`Backend` at fixed points:

* ``module(model)`` / ``optimizer(opt)`` -> :meth:`Backend.prepare_module` /
  :meth:`Backend.prepare_optimizer` (a compiler backend captures the model on the chief's
  first step; a device backend keeps weights and optimizer state on the device);
* session enter -> :meth:`Backend.begin_session` with the mode;
* every batch the chief's dataloader hands out -> :meth:`Backend.prepare_batch` (a device
  backend ships it to the device and hands back device-tensor handles);
* every step boundary (the dataloader asked for its next batch, the loop ended, the
  session ended) -> :meth:`Backend.end_step` with the step closures queued during that step,
  in the order added (a device backend waits for the step's outputs, turns device handles
  in the closures' arguments into CPU tensors, then runs them);
* session exit -> :meth:`Backend.end_session`.

:class:`EagerBackend` is the CPU backend (plain eager PyTorch, the ``csrun_cpu`` validation
run and every run without a device). Device backends register a factory with
:func:`register_device_backend`; ``initialize(cs_ip=...)`` on the chief calls it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch


@dataclass(kw_only=True)
class StepClosure:
    """A function to run at the end of the step it was added in."""

    fn: Callable[..., Any]
    """What to call."""
    args: tuple = ()
    """Positional arguments (device-tensor handles are resolved before the call)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments."""
    run_async: bool = False
    """The device may run it on a helper thread, still in order; the CPU backend runs it inline."""

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


@dataclass(frozen=True, kw_only=True)
class DeviceOptions:
    """What ``initialize()`` was told about the device."""

    cs_ip: str | None = None
    """``HOST:PORT`` of the device (the emulator server), or None for an in-process device."""
    compile_only: bool = False
    """Compile on the first step and stop, without running."""
    validate_only: bool = False
    """Capture and check on the first step and stop, without a full compile."""


class Backend(Protocol):
    """Runs the chief's steps (see the module manual for when each method is called)."""

    name: str

    def prepare_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model the user's loop calls."""

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer the user's loop calls."""

    def begin_session(self, mode: str) -> None:
        """A session in ``train`` or ``eval`` mode starts."""

    def prepare_batch(self, batch: Any) -> Any:
        """The batch as the step receives it."""

    def end_step(self, closures: list[StepClosure]) -> None:
        """A step ended: run its closures, in order."""

    def end_session(self, failed: bool) -> None:
        """The session ended (``failed`` when it ended with an exception)."""


class EagerBackend:
    """Eager PyTorch on the CPU: the user's Python runs the steps, closures run inline."""

    name = "cpu"

    def __init__(self) -> None:
        self.modules: list[torch.nn.Module] = []

    def prepare_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Remember the model (its train/eval mode follows the session); return it unchanged."""
        self.modules.append(model)
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Return the optimizer unchanged."""
        return optimizer

    def begin_session(self, mode: str) -> None:
        """Put the registered models in train or eval mode."""
        for m in self.modules:
            m.train(mode == "train")

    def prepare_batch(self, batch: Any) -> Any:
        """Return the batch unchanged."""
        return batch

    def end_step(self, closures: list[StepClosure]) -> None:
        """Run the closures now, in order (``run_async`` too: there is nothing to overlap with)."""
        for closure in closures:
            closure()

    def end_session(self, failed: bool) -> None:
        """Nothing to release."""


DeviceFactory = Callable[[DeviceOptions], Backend]

_device_factory: DeviceFactory | None = None


def register_device_backend(factory: DeviceFactory | None) -> None:
    """Install the factory ``initialize(cs_ip=...)`` uses on the chief (None removes it)."""
    global _device_factory
    _device_factory = factory


def device_factory() -> DeviceFactory | None:
    """The registered device factory, if any."""
    return _device_factory
