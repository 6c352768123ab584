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
* session exit -> :meth:`Backend.end_session`;
* ``cbtorch.global_step()`` / ``get_state()`` / ``set_state()`` -> :meth:`Backend.global_step`,
  :meth:`Backend.get_state`, :meth:`Backend.set_state` (the legacy checkpoint state, see
  :mod:`csrun.driver.legacy_state`).

:class:`EagerBackend` is the CPU backend (plain eager PyTorch, the ``csrun_cpu`` validation
run and every run without a device). Given compile settings it applies the device's training
semantics (learning-rate schedule from the global step, gradient clipping; see
:mod:`csrun.torch.rules`), so CPU and device runs agree. Device backends register a factory
with :func:`register_device_backend`; ``initialize()`` on the chief calls it when the run
path (:mod:`csrun.driver.run_path`) is not the CPU (csrun.torch installs
:mod:`csrun.torch.device_backend` on import). :class:`~csrun.driver.closures.StepClosure` and
:class:`~csrun.driver.options.DeviceOptions` live in the driver and are named here too.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

import torch

from csrun.compiler.settings import CompileSettings
from csrun.driver import legacy_state
from csrun.driver.closures import StepClosure
from csrun.driver.options import DeviceOptions
from csrun.torch.device_preview import DevicePreview
from csrun.torch.rules import TrainingRules

__all__ = ["Backend", "EagerBackend", "DeviceFactory", "register_device_backend", "device_factory",
           "StepClosure", "DeviceOptions"]


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

    def dispatch_step(self) -> None:
        """The step in the making is complete: start it on the device now (its closures run
        later, at :meth:`end_step`, once the next batch has been fetched)."""

    def end_step(self, closures: list[StepClosure]) -> None:
        """A step ended: run its closures, in order."""

    def end_session(self, failed: bool) -> None:
        """The session ended (``failed`` when it ended with an exception)."""

    def global_step(self) -> int:
        """Training steps taken (including the value a loaded state carried); a step whose update
        a loss scaler skipped counts, as on the system."""

    def skipped_step(self) -> None:
        """A loss scaler skipped this step's optimizer update (a gradient was not finite); the step
        still counts toward :meth:`global_step` (the device counts its own)."""

    def loss_scaled(self, unscaled: bool) -> None:
        """The loop's loss scaler scaled the loss (``unscaled``: it unscaled the gradients again)."""

    def get_state(self) -> dict[str, Any]:
        """The legacy checkpoint state (see :mod:`csrun.driver.legacy_state`)."""

    def set_state(self, state: Mapping[str, Any], *, strict: bool = True, load_optimizer: bool = True) -> None:
        """Load a legacy checkpoint state, before or between steps."""


class EagerBackend:
    """Eager PyTorch on the CPU: the user's Python runs the steps, closures run inline.

    One model and one optimizer per run: ``get_state``/``set_state`` use the last ones
    prepared. ``settings`` (a :class:`~csrun.compiler.CompileSettings`) switch on the
    device's learning-rate schedule and gradient clipping (:class:`TrainingRules`).
    """

    name = "cpu"

    def __init__(self, settings: CompileSettings | None = None) -> None:
        """``settings``: apply the device's schedule and clipping (None: the optimizer's own)."""
        self.modules: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.rules = TrainingRules(settings)
        self.preview = DevicePreview(streaming=settings is not None and settings.streaming)
        """Warnings about what the device will refuse (csrun.torch.device_preview)."""

    def prepare_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Remember the model (its train/eval mode follows the session); return it unchanged but for
        the device preview's watch of its first forwards."""
        self.modules.append(model)
        self.preview.module(model)
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Hook the optimizer (schedule, clipping, step count); return it."""
        if not any(o is optimizer for o in self.optimizers):
            self.optimizers.append(optimizer)
            self.rules.attach(optimizer)
            self.preview.optimizer(optimizer)
        return optimizer

    def begin_session(self, mode: str) -> None:
        """Put the registered models in train or eval mode."""
        for m in self.modules:
            m.train(mode == "train")

    def prepare_batch(self, batch: Any) -> Any:
        """Return the batch unchanged (a new step for the device preview)."""
        self.preview.begin_step()
        return batch

    def dispatch_step(self) -> None:
        """Nothing to start: the user's Python ran the step."""

    def end_step(self, closures: list[StepClosure]) -> None:
        """Run the closures now, in order (``run_async`` too: there is nothing to overlap with)."""
        self.preview.end_step()
        for closure in closures:
            closure()

    def end_session(self, failed: bool) -> None:
        """Nothing to release (the device preview's watch of the first step ends)."""
        self.preview.end_step()

    def global_step(self) -> int:
        """Training steps taken (optimizer steps, and updates the loss scaler skipped)."""
        return self.rules.global_step

    def skipped_step(self) -> None:
        """Count the skipped update's step, so the schedule stays where the device's is."""
        self.rules.global_step += 1

    def loss_scaled(self, unscaled: bool) -> None:
        """Nothing: the scaler scales the CPU's loss itself."""

    def get_state(self) -> dict[str, Any]:
        """The model's and optimizer's state (``amp`` is ``{}``: no loss scaler on the CPU)."""
        return legacy_state.eager_state(self.modules[-1] if self.modules else None,
                                        self.optimizers[-1] if self.optimizers else None, self.rules.global_step)

    def set_state(self, state: Mapping[str, Any], *, strict: bool = True, load_optimizer: bool = True) -> None:
        """Load weights (and, with ``load_optimizer``, optimizer state and the global step)."""
        state = legacy_state.check(state)
        legacy_state.load_eager(self.modules[-1] if self.modules else None,
                                self.optimizers[-1] if self.optimizers else None, state,
                                strict=strict, load_optimizer=load_optimizer)
        if load_optimizer:
            self.rules.global_step = legacy_state.step_of(state)


DeviceFactory = Callable[[DeviceOptions], Backend]

_device_factory: DeviceFactory | None = None


def register_device_backend(factory: DeviceFactory | None) -> None:
    """Install the factory ``initialize(cs_ip=...)`` uses on the chief (None removes it)."""
    global _device_factory
    _device_factory = factory


def device_factory() -> DeviceFactory | None:
    """The registered device factory, if any."""
    return _device_factory
