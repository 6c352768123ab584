"""Programs as bytes: save an ExportedProgram and load one back with weights-only unpickling.

``torch.export.load`` unpickles weights and constants, and when a weights-only load fails it
falls back to a full (arbitrary-code) unpickle. :func:`load_program` refuses instead: while it
runs, every ``torch.load`` the loader makes is forced to ``weights_only=True`` and a refusal
becomes :class:`ProgramRejected`. The override is process-wide for the duration of one load and
serialised by a lock; nothing else in the emulator calls ``torch.load``.
"""

from __future__ import annotations

import io
import threading
import zipfile
from typing import Any

import torch

from csrun.emulator.errors import ProgramRejected

_LOAD_LOCK = threading.Lock()


class _Refused(Exception):
    """A weights-only unpickle failed inside the program loader."""


def save_program(program: torch.export.ExportedProgram) -> bytes:
    """Serialise a program (``torch.export.save``) to bytes."""
    buf = io.BytesIO()
    torch.export.save(program, buf)
    return buf.getvalue()


def load_program_file(path: str) -> torch.export.ExportedProgram:
    """Load a program archive from a file (e.g. a compile directory) with :func:`load_program`."""
    with open(path, "rb") as f:
        return load_program(f.read())


def load_program(data: bytes) -> torch.export.ExportedProgram:
    """Load a program from bytes, refusing anything that needs full unpickling.

    Raises :class:`ProgramRejected` with the reason (not a zip archive, a pickle that a
    weights-only load refuses, a damaged archive).
    """
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise ProgramRejected("program rejected: not a torch.export archive (not a zip file)")
    original = torch.load

    def strict_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        try:
            return original(f, *args, **kwargs)
        except Exception as exc:  # any refusal of the weights-only unpickler
            raise _Refused(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None

    with _LOAD_LOCK:
        torch.load = strict_load  # type: ignore[assignment]
        try:
            ep = torch.export.load(io.BytesIO(data))
        except _Refused as exc:
            raise ProgramRejected(
                f"program rejected: it needs full unpickling, which the emulator never does ({exc})"
            ) from None
        except Exception as exc:
            cause = exc
            while cause.__cause__ is not None or cause.__context__ is not None:
                nxt = cause.__cause__ or cause.__context__
                if isinstance(nxt, _Refused):
                    raise ProgramRejected(
                        f"program rejected: it needs full unpickling, which the emulator never does ({nxt})"
                    ) from None
                cause = nxt  # type: ignore[assignment]
            raise ProgramRejected(f"program rejected: could not load the archive ({type(exc).__name__}: {exc})") from None
        finally:
            torch.load = original  # type: ignore[assignment]
    if not isinstance(ep, torch.export.ExportedProgram):
        raise ProgramRejected(f"program rejected: archive holds a {type(ep).__name__}, not an ExportedProgram")
    return ep
