"""``cerebras.appliance.errors``: the appliance client's exceptions."""

from __future__ import annotations

from csrun.errors import UserError


class ApplianceError(UserError):
    """Something only the system's appliance could do (the message says what to do instead)."""


class ApplianceNanError(RuntimeError):
    """A step's loss was NaN or inf (raised by the script's own loss check)."""


__all__ = ["ApplianceError", "ApplianceNanError"]
