"""``cstorch.save`` / ``cstorch.load``: the ``.mdl`` checkpoint, shared with cbtorch and the runner.

Both are cbtorch's (:mod:`csrun.torch.saving`: atomic write, plain data only, weights-only
read: nothing in a file is ever run). One thing is added so the three kinds of script read
each other's files: the loss scaler's entry is ``grad_scaler`` in 2.x scripts and ``amp`` in
cbtorch's and the runner's. :func:`save` writes a ``grad_scaler`` entry under ``amp`` too
(when there is no ``amp``); :func:`load` returns a file's ``amp`` entry under ``grad_scaler``
too (when there is none and ``amp`` is not empty). The rest is the same layout: ``model``,
``optimizer``, ``lr_scheduler`` (``{"global_step": N}``), ``global_step``.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import csrun.torch as cbtorch


def save(state_dict: Any, checkpoint_file: str | os.PathLike[str]) -> None:
    """Write ``state_dict`` (plain data: tensors, dicts, lists, numbers, strings) to ``checkpoint_file``."""
    if isinstance(state_dict, Mapping) and "grad_scaler" in state_dict and "amp" not in state_dict:
        state_dict = {**state_dict, "amp": state_dict["grad_scaler"]}
    cbtorch.save(state_dict, checkpoint_file)


def load(checkpoint_file: str | os.PathLike[str], map_location: Any = "cpu") -> Any:
    """Read a ``.mdl`` file (weights-only) written by cstorch, cbtorch or the runner."""
    state = cbtorch.load(checkpoint_file, map_location=map_location)
    if isinstance(state, dict) and state.get("amp") and "grad_scaler" not in state:
        state["grad_scaler"] = state["amp"]
    return state


__all__ = ["save", "load"]
