"""Errors the wafer emulator raises.

User-fixable problems derive from :class:`csrun.errors.UserError` (a bad spec value, a
device tensor read outside a step closure, a system that cannot be reached or is busy).
Failures of the device itself (a step that raised, a lost link) are :class:`DeviceError`.
"""

from __future__ import annotations

from csrun.errors import UserError
from csrun.program.errors import SpecError  # noqa: F401  (the device contract's; emulator code raises it from here)

READ_HINT = (
    "device tensors have no value until the step they belong to has run on the system; "
    "read them in a step closure (use cbtorch.add_step_closure / @step_closure)"
)
"""The hint every refused read of a device tensor carries, as the system said it."""


class DeviceTensorReadError(UserError):
    """A device tensor's value was read outside a step closure."""


class ProgramRejected(UserError):
    """A program archive that the emulator refuses to load (not plain data, see csrun.program.archive, or damaged)."""


class SystemUnreachable(UserError):
    """No emulator answered at the given address within the retry window."""

    exit_code = 1


class SystemBusy(UserError):
    """The emulator is serving another job."""

    exit_code = 1


class TooManyConnections(SystemBusy):
    """The emulator has as many connections waiting to authenticate as it admits."""


class AuthenticationFailed(UserError):
    """The emulator refused the token, or the emulator could not prove it holds the token."""

    exit_code = 1


class VersionMismatch(UserError):
    """The two sides speak different wire protocol versions."""

    exit_code = 1


class InsecureSetup(UserError):
    """A secret that is weak or readable by others (a short token, a token or key file others can read)."""


class ProtocolError(Exception):
    """A frame that breaks the wire protocol (bad magic, size over a limit, malformed header)."""
