"""``cbtorch.save`` / ``cbtorch.load``: the ``.mdl`` checkpoint file, written and read as data.

A ``.mdl`` file is ``torch.save`` of a dict of plain data — tensors, dicts, lists, numbers,
strings, None — in the layout the runner writes (``model``, ``optimizer``, ``lr_scheduler``,
``amp``, ``global_step``; any other keys a script adds are kept). Both go through the one
writer and the one verifying reader of the format, the runner's (:mod:`csrun.mdl`): :func:`save`
writes atomically with a ``<file>.sha256`` beside it and refuses anything
``torch.load(weights_only=True)`` could not read back (a module, a function, an arbitrary
object) before it writes a byte; :func:`load` checks the checksum (or the archive's CRCs when
there is none) and reads with ``weights_only=True`` only: a file holding pickled code is refused
in one line and nothing in it runs. Both name the path.
"""

from __future__ import annotations

import os
from typing import Any

from csrun.mdl import CheckpointError, read_mdl, write_mdl

CheckpointFileError = CheckpointError
"""The one-line error of a ``.mdl`` file that cannot be written as data or read back (cbtorch's name)."""


def save(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` (plain data, e.g. :func:`csrun.torch.get_state`'s) to ``path`` atomically, with its checksum."""
    write_mdl(path, obj, plain_only=True)


def load(path: str | os.PathLike[str], map_location: Any = "cpu") -> Any:
    """Read a ``.mdl`` file (verified; weights-only: nothing in it is executed)."""
    return read_mdl(path, map_location=map_location)
