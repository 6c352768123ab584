"""The compile directory's program archive, ``program.pt2``: written without weight values, read as data.

Reading and writing are :mod:`csrun.program.archive`'s (the one reader, shared with the
emulator server: nothing in an archive is unpickled, no string in it is executed; see its
docstring). This module adds what the compile cache needs on top: weights left out of the
archive (shape-only placeholders: the compile key covers weight shapes, not values) and bound
again from the model or a checkpoint (:func:`bind_weights`). A refused archive raises
:class:`~csrun.compiler.errors.UnsafeProgram`.
"""

from __future__ import annotations

from typing import Mapping

import torch

from csrun.compiler.errors import UnsafeProgram
from csrun.program.archive import PROGRAM_FILE, ArchiveRefused, has_weight_values, read_archive, weight_placeholders, write_archive

__all__ = ["PROGRAM_FILE", "bind_weights", "has_weight_values", "load_exported_program", "module_with_weights",
           "save_program", "weight_placeholders"]


def save_program(program: torch.export.ExportedProgram, path: str, *, with_weights: bool = False) -> None:
    """Write the program archive; by default every weight is a shape/dtype placeholder
    (:func:`~csrun.program.archive.write_archive`); a run takes its weights from the model or
    checkpoint (:func:`module_with_weights`). ``with_weights=True`` stores the values."""
    write_archive(program, path, with_weights=with_weights)


def load_exported_program(path: str) -> torch.export.ExportedProgram:
    """Read a program archive as data (:func:`~csrun.program.archive.read_archive`); tied weights
    are one tensor. Raises :class:`UnsafeProgram` for anything refused."""
    try:
        return read_archive(path)
    except ArchiveRefused as exc:
        raise UnsafeProgram(str(exc)) from None


def bind_weights(program: torch.export.ExportedProgram, weights: Mapping[str, torch.Tensor]) -> torch.export.ExportedProgram:
    """Give the program's parameters and buffers these values (e.g. ``model.state_dict()``), in place.

    Returns the same program. Names the program ties (one tensor under several names, e.g. an
    MLM head tied to the embeddings; the archive reader keeps ties) get one tensor; parameters
    stay Parameters with their ``requires_grad``. The values are copied (the program never
    shares memory with the caller's model). Raises ``KeyError`` for a missing name and
    ``ValueError`` for a shape or dtype that differs from the program's.
    """
    state = program.state_dict
    new: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for name, t in list(state.items()):
            if id(t) not in new:
                v = weights[name].detach()
                if tuple(v.shape) != tuple(t.shape) or v.dtype != t.dtype:
                    raise ValueError(f"weight {name}: the program has {t.dtype}{list(t.shape)}, "
                                     f"the given value is {v.dtype}{list(v.shape)}")
                v = v.clone()
                new[id(t)] = torch.nn.Parameter(v, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else v
            state[name] = new[id(t)]
    return program


def module_with_weights(program: torch.export.ExportedProgram, weights: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """``program.module()`` after :func:`bind_weights` (tied names stay one Parameter)."""
    return bind_weights(program, weights).module()
