"""The device path of the user API: :class:`DeviceBackend`, the :class:`~csrun.torch.backend.Backend` seam onto the driver.

``initialize()`` picks it on the chief when the run path (:mod:`csrun.driver.run_path`) is
not the CPU. Everything it does is done by one :class:`~csrun.driver.driver.DeviceDriver`
(compile at the first ``model(batch)``, load the program, open the device, run the steps,
carry weights between train and eval programs, get/set the legacy state; see
:mod:`csrun.driver.driver` for the behaviour). This adapter only maps the user API's calls
onto it and tells it the session's DataLoader (for the compile's short-last-batch check).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch.utils.data import DataLoader

from csrun.driver.closures import StepClosure
from csrun.driver.compile_info import CompileInfo
from csrun.driver.driver import Device, DeviceDriver, DeviceUsageError
from csrun.driver.options import DeviceOptions
from csrun.torch.process_state import state

__all__ = ["DeviceBackend", "DeviceUsageError", "make_device_backend"]


def _session_loader() -> DataLoader | None:
    """The user's DataLoader of the running Session, if any."""
    session = state().session
    return None if session is None else session.dataloader.loader


class DeviceBackend:
    """Runs the chief's steps on the emulator through a :class:`~csrun.driver.driver.DeviceDriver`."""

    name = "device"

    def __init__(self, options: DeviceOptions, *, device: Device | None = None) -> None:
        """``device``: an already open device (tests); else the driver opens one at the first load."""
        self.driver = DeviceDriver(options, device=device, session_loader=_session_loader)

    @property
    def compile_info(self) -> CompileInfo | None:
        """The last compile's figures (None before the first compile)."""
        return self.driver.compile_info

    def prepare_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Route ``model(batch)`` to the device."""
        return self.driver.wrap_module(model)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """``step()`` / ``zero_grad()`` become order checks (the device runs the optimizer)."""
        return self.driver.wrap_optimizer(optimizer)

    def begin_session(self, mode: str) -> None:
        """A session in ``train`` or ``eval`` mode starts."""
        self.driver.begin_session("eval" if mode == "eval" else "train")

    def prepare_batch(self, batch: Any) -> Any:
        """A new step: the batch's tensors become step values (sent at the step's boundary)."""
        return self.driver.begin_step(batch)

    def dispatch_step(self) -> None:
        """Send the step in the making to the device (compiling it first, on the first step)."""
        self.driver.dispatch_step()

    def end_step(self, closures: list[StepClosure]) -> None:
        """Run the step's closures with their device tensors resolved."""
        self.driver.end_step(closures)

    def end_session(self, failed: bool) -> None:
        """Wait for the closures and the device; check the last step was complete."""
        self.driver.end_session(failed)

    def global_step(self) -> int:
        """Training steps taken (plus a loaded state's); the device counts a skipped update's step."""
        return self.driver.global_step

    def skipped_step(self) -> None:
        """Nothing: the device's loss scaling skips and counts its own steps."""

    def loss_scaled(self, unscaled: bool) -> None:
        """The loop's scaler scaled the loss, or unscaled the gradients (the device does both)."""
        self.driver.order.loss_scaled(unscaled)

    def get_state(self) -> dict[str, Any]:
        """The legacy state; waits for every submitted step."""
        return self.driver.get_state()

    def set_state(self, state: Mapping[str, Any], *, strict: bool = True, load_optimizer: bool = True) -> None:
        """Load onto the device now, or when the program is loaded."""
        self.driver.set_state(state, strict=strict, load_optimizer=load_optimizer)

    def close(self) -> None:
        """Release the closure thread and the device."""
        self.driver.close()


def make_device_backend(options: DeviceOptions) -> DeviceBackend:
    """The factory :func:`csrun.torch.backend.register_device_backend` installs."""
    return DeviceBackend(options)
