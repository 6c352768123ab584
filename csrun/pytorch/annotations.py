"""The 2.x names that annotate a model for the system's compiler, and what they mean on csrun's device.

=============================  ==============================================================
``name_scope(name)``           a context naming the ops inside (R1's ``core.name_scope``);
                               csrun's compiled program is the step's graph: nothing changes
``pol(level=, bwd_level=)``    the precision optimisation level for one module or function:
                               returns it unchanged (csrun's device computes what the graph
                               says; the run's level is ``CSConfig.precision_opt_level``)
``make_constant(tensor)``      a tensor the system keeps as a program constant: the tensor
``add_debug_name(module)``     names every submodule (``get_debug_name`` reads it: its path
                               in the model, as ``named_modules`` gives it)
``use_cs()``                   True when this run's steps run on the device (the CSX backend)
``from_numpy`` / ``to_numpy``  torch's conversions
=============================  ==============================================================
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import numpy as np
import torch

from csrun.torch.helpers import use_cs
from csrun.torch.r1.framework import name_scope

F = TypeVar("F", bound=Callable[..., Any])

_DEBUG_NAME = "_csrun_debug_name"


def pol(level: int | None = None, bwd_level: int | None = None) -> Callable[[F], F]:
    """A decorator returning the module or function unchanged (see the module manual)."""
    for name, value in (("level", level), ("bwd_level", bwd_level)):
        if value is not None and value not in (0, 1, 2):
            from csrun.torch.r1.unsupported import LegacyNameError

            raise LegacyNameError(f"cstorch.pol({name}={value!r}): the precision optimisation levels are 0, 1 and 2")

    def keep(fn: F) -> F:
        return fn

    return keep


def make_constant(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself (a program constant on the system)."""
    return tensor


def add_debug_name(module: torch.nn.Module, root_name: str | None = None) -> None:
    """Name ``module`` and each submodule by its path (``get_debug_name`` reads it)."""
    for path, sub in module.named_modules():
        full = ".".join(p for p in (root_name, path) if p) or type(module).__name__.lower()
        setattr(sub, _DEBUG_NAME, full)


def get_debug_name(module: torch.nn.Module) -> str:
    """The name :func:`add_debug_name` gave ``module`` (its class name when it has none)."""
    return str(getattr(module, _DEBUG_NAME, type(module).__name__.lower()))


def from_numpy(array: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy``."""
    return torch.from_numpy(array)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's values as a numpy array (on the CPU)."""
    return tensor.detach().cpu().numpy()


__all__ = ["name_scope", "pol", "make_constant", "add_debug_name", "get_debug_name", "use_cs", "from_numpy",
           "to_numpy"]
