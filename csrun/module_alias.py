"""One module under two names: ``cerebras.pytorch`` *is* :mod:`csrun.pytorch`, not a copy of it.

The legacy shim (``--legacy-imports``) maps the system's package names onto csrun's. A shim
file that re-exported names would make a second module per submodule (``cerebras.pytorch.utils``
beside ``csrun.pytorch.utils``) with its own globals; a script that set something through one
name and read it through the other would see two states. So the shim's package file calls
:func:`become`: it puts the csrun module itself in ``sys.modules`` under the legacy name and
installs one :class:`AliasFinder` that answers every ``legacy.sub.module`` import with the
module ``csrun.sub.module``, the same object.

Nothing here runs code from a file or the network: an alias only ever names a csrun module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Sequence

ALIASES: dict[str, str] = {
    "cerebras.pytorch": "csrun.pytorch",
    "cerebras_pytorch": "csrun.pytorch",
    "cerebras.appliance": "csrun.appliance",
}
"""Legacy package name -> the csrun package it is (the 2.x names; R1.x's are shim files)."""


def target_of(fullname: str) -> str | None:
    """The csrun module ``fullname`` is an alias of (None when it is not under an alias)."""
    for legacy, real in ALIASES.items():
        if fullname == legacy or fullname.startswith(legacy + "."):
            return real + fullname[len(legacy):]
    return None


class _SameModule(importlib.abc.Loader):
    """Loads an alias by importing its csrun module and handing back that very object."""

    def __init__(self, real: str) -> None:
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.real)

    def exec_module(self, module: ModuleType) -> None:
        return None


class AliasFinder(importlib.abc.MetaPathFinder):
    """Finds ``cerebras.pytorch.*`` (and the other :data:`ALIASES`) as their csrun modules."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        real = target_of(fullname)
        if real is None or real == fullname:
            return None
        if importlib.util.find_spec(real) is None:
            return None  # the usual ModuleNotFoundError, under the name the script used
        return importlib.machinery.ModuleSpec(fullname, _SameModule(real))


def install() -> None:
    """Put the one :class:`AliasFinder` first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())


_becoming = 0


def becoming() -> bool:
    """True while :func:`become` imports a csrun package (its ``__init__`` must not act on import yet)."""
    return _becoming > 0


def become(legacy_name: str) -> ModuleType:
    """Called by a shim package file: ``legacy_name`` becomes its csrun module in ``sys.modules``.

    Once the alias is in place, the module's ``__after_alias__()`` runs, if it has one: what a
    package does when it is first imported (``csrun.pytorch``: a streamer waits for its role)
    runs there, where importing the package under its legacy name again finds it whole.
    """
    global _becoming
    real = target_of(legacy_name)
    if real is None:
        raise ImportError(f"{legacy_name} is not one of csrun's legacy aliases ({', '.join(ALIASES)})")
    install()
    _becoming += 1
    try:
        module = importlib.import_module(real)
    finally:
        _becoming -= 1
    sys.modules[legacy_name] = module
    after = getattr(module, "__after_alias__", None)
    if callable(after):
        after()
    return module


__all__ = ["ALIASES", "AliasFinder", "become", "becoming", "install", "target_of"]
