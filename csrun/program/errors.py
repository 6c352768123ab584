"""Errors of the device contract: a program spec value that cannot run, and the device's own failures."""

from __future__ import annotations

from csrun.errors import UserError


class SpecError(UserError):
    """A program spec value the emulator cannot run (bad schedule, optimizer key, precision)."""


class DeviceError(RuntimeError):
    """The device failed: a step raised, or the link to a remote device broke."""


class StepFailed(DeviceError):
    """A step raised on the device; re-raised on the caller at the next step boundary."""

    def __init__(self, step: int, message: str) -> None:
        super().__init__(f"step {step} failed on the device: {message}")
        self.step = step


class LinkLost(DeviceError):
    """The connection to a remote emulator broke."""


class SystemReclaimed(LinkLost):
    """The emulator took the system back from this job: it sent nothing for the server's idle limit."""


__all__ = ["DeviceError", "LinkLost", "SpecError", "StepFailed", "SystemReclaimed"]
