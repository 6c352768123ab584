"""``cbtorch.save`` / ``cbtorch.load``: the ``.mdl`` checkpoint file, written and read as data.

A ``.mdl`` file is ``torch.save`` of a dict of plain data — tensors, dicts, lists, numbers,
strings, None — in the layout the runner writes (``model``, ``optimizer``, ``lr_scheduler``,
``amp``, ``global_step``; any other keys a script adds are kept). :func:`save` writes it
atomically (a temporary file in the same folder, fsync'ed, renamed into place) and refuses
anything ``torch.load(weights_only=True)`` could not read back (a module, a function, an
arbitrary object) before it writes a byte. :func:`load` reads with ``weights_only=True`` only:
a file holding pickled code is refused in one line and nothing in it runs. Both name the path.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch

from csrun.errors import UserError


class CheckpointFileError(UserError):
    """A ``.mdl`` file that cannot be written or read as weights-only data."""

    exit_code = 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def save(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` (plain data, e.g. :func:`csrun.torch.get_state`'s) to ``path`` atomically."""
    target = Path(path)
    buf = io.BytesIO()
    try:
        torch.save(obj, buf)
        buf.seek(0)
        torch.load(buf, weights_only=True)  # what cannot be read back as data is not written
    except Exception as exc:  # noqa: BLE001 - torch reports an unsupported object in many ways
        raise CheckpointFileError(f"cbtorch.save({str(target)!r}): the object is not plain data (tensors, dicts, "
                                  f"lists, numbers, strings): {_first_line(exc)}") from None
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(buf.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        raise CheckpointFileError(f"cbtorch.save: cannot write {target}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def load(path: str | os.PathLike[str], map_location: Any = "cpu") -> Any:
    """Read a ``.mdl`` file (weights-only: nothing in it is executed)."""
    target = Path(path)
    if not target.is_file():
        raise CheckpointFileError(f"cbtorch.load: no such file: {target}")
    try:
        return torch.load(target, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - every refusal means "not a weights-only file"
        raise CheckpointFileError(f"cbtorch.load({str(target)!r}): not a weights-only checkpoint (nothing in it "
                                  f"was run): {_first_line(exc)}") from None
