"""Programs as bytes on the link: the client writes an archive, the server reads it as data.

Both ends use the one program-archive reader and writer, :mod:`csrun.program.archive` (see its
docstring for what the server accepts and refuses, and why). A refusal becomes
:class:`~csrun.emulator.errors.ProgramRejected`, one line naming "program sent by client" and
the entry or field.
"""

from __future__ import annotations

import torch

from csrun.emulator.remote.errors import ProgramRejected
from csrun.program import archive


def save_program(program: torch.export.ExportedProgram) -> bytes:
    """The program's archive, with its weights, as bytes (:func:`csrun.program.archive.archive_bytes`)."""
    return archive.archive_bytes(program)


def load_program(data: bytes) -> torch.export.ExportedProgram:
    """The program in an archive a client sent; raises :class:`ProgramRejected` for anything refused."""
    try:
        return archive.read_archive(data, source=archive.FROM_CLIENT)
    except archive.ArchiveRefused as exc:
        raise ProgramRejected(str(exc)) from None
