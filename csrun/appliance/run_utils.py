"""``cerebras.appliance.run_utils``: the appliance's debug arguments, which csrun takes none of.

The 2.x flow builds a :class:`DebugArgs` on every run (``get_debug_args(None)``), may write the
memory limits of the appliance's pods into it (``runconfig.*_memory_gi``) and hands it to
``CSConfig(debug_args=...)``. Here it is a small typed record with the same attribute paths;
``CSConfig`` accepts it while it is as built (:meth:`DebugArgs.is_default`) and refuses it,
naming the field, once anything was set. Reading one from a file, ``set_ini``, and
``update_debug_args_from_keys`` are the appliance's compiler and runtime switches: each
raises one :class:`~csrun.appliance.errors.ApplianceError` line when called.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, NoReturn

from csrun.appliance.errors import ApplianceError


@dataclass
class ResourceRequest:
    """One appliance pod's resource request (``memory_bytes``: 0, the appliance's default)."""

    memory_bytes: int = 0
    """Memory the pod asks for (0: default)."""


@dataclass
class DebugUser:
    """``DebugArgs.debug_usr``: the user-settable part (the appliance pods' memory requests)."""

    compile_coord_resource: ResourceRequest = field(default_factory=ResourceRequest)
    execute_coord_resource: ResourceRequest = field(default_factory=ResourceRequest)
    worker_resource: ResourceRequest = field(default_factory=ResourceRequest)
    activation_resource: ResourceRequest = field(default_factory=ResourceRequest)
    command_resource: ResourceRequest = field(default_factory=ResourceRequest)
    weight_resource: ResourceRequest = field(default_factory=ResourceRequest)


@dataclass
class DebugArgs:
    """The appliance's debug arguments, as built: nothing set (see the module manual)."""

    debug_usr: DebugUser = field(default_factory=DebugUser)
    """The appliance pods' memory requests."""

    def changed(self) -> list[str]:
        """The dotted names of the fields set to something other than their default."""
        return [f"debug_usr.{f.name}.memory_bytes" for f in fields(DebugUser)
                if getattr(self.debug_usr, f.name).memory_bytes]

    def is_default(self) -> bool:
        """True while nothing was set."""
        return not self.changed()


def _refuse(what: str) -> NoReturn:
    raise ApplianceError(f"{what}: csrun has no appliance compiler or runtime to pass debug arguments to; "
                         f"remove it from the runconfig")


def get_debug_args(path: str | None = None) -> DebugArgs:
    """A new :class:`DebugArgs` (``path`` None); a file of them is refused (the appliance's format)."""
    if path:
        _refuse(f"debug_args_path={path!r}")
    return DebugArgs()


def write_debug_args(debug_args: DebugArgs, path: str) -> None:
    """Refused: there is no appliance to read the file."""
    _refuse(f"write_debug_args({path!r})")


def set_ini(debug_args: DebugArgs, **kwargs: Any) -> None:
    """Refused: ini switches are the appliance compiler's."""
    _refuse(f"runconfig.ini ({', '.join(sorted(kwargs)) or 'empty'})")


def set_default_ini(debug_args: DebugArgs, **kwargs: Any) -> None:
    """Refused: ini switches are the appliance compiler's."""
    _refuse(f"default ini switches ({', '.join(sorted(kwargs)) or 'empty'})")


def update_debug_args_from_keys(debug_args: DebugArgs, flat_dargs: dict[str, Any]) -> None:
    """Refused: ``runconfig.debug_args`` keys are the appliance's."""
    _refuse(f"runconfig.debug_args ({', '.join(sorted(flat_dargs)) or 'empty'})")


__all__ = ["DebugArgs", "DebugUser", "ResourceRequest", "get_debug_args", "write_debug_args", "set_ini",
           "set_default_ini", "update_debug_args_from_keys"]
