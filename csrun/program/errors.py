"""Errors of the device contract: a program spec value that cannot run."""

from __future__ import annotations

from csrun.errors import UserError


class SpecError(UserError):
    """A program spec value the emulator cannot run (bad schedule, optimizer key, precision)."""


__all__ = ["SpecError"]
