"""The device seam: what a Session asks of the thing that runs the steps.

The user API never runs a step itself; it calls a :class:`Backend` at fixed points:

* ``module(model)`` / ``optimizer(opt)`` -> :meth:`Backend.prepare_module` /
  :meth:`Backend.prepare_optimizer` (a compiler backend captures the model on the chief's
  first step; a device backend keeps weights and optimizer state on the device);
* session enter -> :meth:`Backend.begin_session` with the mode and the session's DataLoader;
* every batch the chief's dataloader hands out -> :meth:`Backend.next_step`, the step
  boundary in one call: the backend ends the step in flight (a device backend sends it to the
  device), fetches the next batch, runs the ended step's closures in the order added (a device
  backend first turns device values in their arguments into CPU tensors), and opens the next
  step with the batch (a device backend hands back step values);
* a boundary with no next batch (the loop ended, ``mark_step``, the session ended) ->
  :meth:`Backend.end_step` with the step's closures;
* cstorch's training settings -> :meth:`Backend.apply_settings` (the compile's settings);
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
:class:`~csrun.driver.driver.DeviceDriver` on import: the driver is the device backend). :class:`~csrun.driver.closures.StepClosure` and
:class:`~csrun.driver.options.DeviceOptions` live in the driver and are named here too.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

import torch

from torch.utils.data import DataLoader

from csrun.compiler.settings import CompileSettings
from csrun.driver import legacy_state
from csrun.driver.closures import StepClosure
from csrun.driver.options import DeviceOptions
from csrun.stream.source import EPOCH_END
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

    def begin_session(self, mode: str, loader: DataLoader | None = None) -> None:
        """A session in ``train`` or ``eval`` mode starts (``loader``: its DataLoader as the user gave it)."""

    def next_step(self, fetch: Callable[[], Any], ended: list[StepClosure] | None) -> Any:
        """The step boundary before a batch: end the step in flight (``ended``: its closures, None
        when none ended), ``fetch()`` the next batch, run the closures, open the next step.
        Returns the batch as the step receives it, or ``EPOCH_END`` as ``fetch`` gave it."""

    def end_step(self, closures: list[StepClosure]) -> None:
        """A step ended with no next batch: run its closures, in order."""

    def apply_settings(self, settings: CompileSettings) -> None:
        """Compile settings from the user API (refused once a step is compiled with others)."""

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

    def begin_session(self, mode: str, loader: DataLoader | None = None) -> None:
        """Put the registered models in train or eval mode."""
        for m in self.modules:
            m.train(mode == "train")

    def next_step(self, fetch: Callable[[], Any], ended: list[StepClosure] | None) -> Any:
        """Fetch the next batch, run the ended step's closures, return the batch unchanged (a new
        step for the device preview)."""
        try:
            item = fetch()
        finally:
            if ended is not None:
                self.end_step(ended)
        if item is not EPOCH_END:
            self.preview.begin_step()
        return item

    def apply_settings(self, settings: CompileSettings) -> None:
        """Run the settings' schedule and clipping from the next step on (:class:`TrainingRules`)."""
        self.rules.configure(settings)

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

