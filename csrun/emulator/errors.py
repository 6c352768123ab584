"""Errors of the device API: a device tensor read outside a step closure.

A bad spec value is :class:`csrun.program.errors.SpecError` and a failure of the device
itself (a step that raised, a lost link) a :class:`csrun.program.errors.DeviceError` (the
device contract's); the link's own errors are in :mod:`csrun.emulator.remote.errors`.
"""

from __future__ import annotations

from csrun.errors import UserError

READ_HINT = (
    "device tensors have no value until the step they belong to has run on the system; "
    "read them in a step closure (use cbtorch.add_step_closure / @step_closure)"
)
"""The hint every refused read of a device tensor carries, as the system said it."""


class DeviceTensorReadError(UserError):
    """A device tensor's value was read outside a step closure."""
