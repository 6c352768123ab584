"""Errors of the link to ``cs_emulator``: a system that cannot be reached, is busy (its queue
full, or this job's wait in it over), or refuses the token, a program it rejects, a weak secret, a frame that breaks the protocol.

User-fixable problems derive from :class:`csrun.errors.UserError`.
"""

from __future__ import annotations

from csrun.errors import UserError


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


class QueueTimeout(SystemBusy):
    """The job waited in the queue of a busy emulator for as long as ``CSRUN_QUEUE_TIMEOUT`` allows."""


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
