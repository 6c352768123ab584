"""Files written whole or not at all: the one atomic-write helper.

Every file csrun writes that a later run reads (checkpoints and their checksums, a model's
``performance.json``, the preemption count, a task's exit record) is written here the same
way: under a temporary name beside it (``.<name>.<pid>.tmp``: never mistaken for the real
thing by a reader, and its owner's pid in the name), flushed and fsync'ed, renamed over the
target, and the folder fsync'ed, so a crash leaves the old file or the new one, never half
of one. A failed write removes its temporary file and raises the ``OSError`` (the caller says
what it was writing).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import BinaryIO, Callable

Writer = Callable[[BinaryIO], object]
"""Writes a file's content to the open binary file it is given."""


def temporary_name(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


TEMPORARY = re.compile(r"^\..+\.\d+\.tmp$")
"""The name :func:`temporary_name` gives (``.<name>.<pid>.tmp``)."""


def remove_temporaries(folder: Path) -> list[Path]:
    """Delete the temporaries a crashed writer left in ``folder`` (call it only while no other process
    writes there: e.g. holding the folder's lock); returns what was removed."""
    removed: list[Path] = []
    if not Path(folder).is_dir():
        return removed
    for path in Path(folder).iterdir():
        if TEMPORARY.match(path.name) and path.is_file():
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            removed.append(path)
    return removed


def write_temporary(path: Path, content: Writer | bytes) -> Path:
    """Write ``content`` (bytes, or a writer) to ``path``'s temporary name, flushed and fsync'ed;
    the temporary path (the caller renames it: :func:`atomic_write` does both)."""
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            if isinstance(content, bytes):
                f.write(content)
            else:
                content(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def atomic_write(path: str | os.PathLike[str], content: Writer | bytes | str, *, durable: bool = True) -> Path:
    """Write ``path`` whole or not at all (see the module manual); ``durable``: fsync the folder
    after the rename (the rename itself survives a crash). Returns ``path``."""
    target = Path(path)
    data = content.encode() if isinstance(content, str) else content
    tmp = write_temporary(target, data)
    try:
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        fsync_folder(target.parent)
    return target


def fsync_folder(folder: Path) -> None:
    """Make the folder's entries (a rename into it) durable; a file system that does not let a
    folder be opened is left as it is."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
