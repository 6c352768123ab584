"""Names of torchvision this stand-in does not have: they import, and using one raises.

The 2.x Model Zoo imports every data processor at start-up (its registry), so a run of
fc_mnist imports torchvision names that only other models use. Each absent name is a class
that raises ``ModuleNotFoundError`` when called or subclassed-and-built; each absent submodule
(``torchvision.ops``, ``torchvision.datasets.vision``, ...) is a module of such names.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any


def absent(qualname: str) -> type:
    """A class standing for ``qualname``: it can be named and subclassed; building one raises."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise ModuleNotFoundError(f"{qualname} is not in the torchvision stand-in (bench/compat/stand_ins)")

    return type(qualname.rsplit(".", 1)[-1], (), {"__init__": __init__, "__call__": __init__,
                                                  "__module__": qualname.rpartition(".")[0]})


def open_module(module: ModuleType) -> None:
    """Let ``module`` answer absent names and absent submodules."""
    module.__path__ = getattr(module, "__path__", [])  # type: ignore[attr-defined]

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = absent(f"{module.__name__}.{name}")
        setattr(module, name, value)
        return value

    module.__getattr__ = __getattr__  # type: ignore[attr-defined]


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = ModuleType(spec.name)
        open_module(module)
        return module

    def exec_module(self, module: ModuleType) -> None:
        return None


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("torchvision."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            if finder.find_spec(fullname, path, target) is not None:
                return None  # a real file of the stand-in
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


def install() -> None:
    """Answer every absent ``torchvision.*`` submodule (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
