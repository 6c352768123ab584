"""The small hierarchy of errors csrun raises for things a user can fix.

Every command catches :class:`UserError` at its top level, prints ``<command>: error: <message>``
and exits with the error's ``exit_code`` (2 for bad input), so a user never sees a Python
traceback for a mistake of theirs. Messages name the bad value and say what would be right.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix: bad flag, bad value, bad config, missing tool."""

    exit_code: int = 2


class UsageError(UserError):
    """A command-line option or value that the command does not accept."""


class SiteConfigError(UserError):
    """A site config (configs/csrun.yaml or a CSRUN_* override) with a bad key or value."""


class LaunchError(UserError):
    """A launch that cannot be built or started (impossible layout, missing launcher)."""

    exit_code = 1
