"""The ``.mdl`` checkpoint file: one writer and one verifying reader, for the runner and ``cbtorch.save`` alike.

A ``.mdl`` file is ``torch.save`` of a dict of plain data (tensors, dicts, lists, numbers,
strings, None), so that it is read with ``torch.load(weights_only=True)``: checkpoints are
untrusted files and are never fully unpickled.

Writing (:func:`write_mdl`) is atomic (:mod:`csrun.files`): the file is written under a
temporary name in the same folder, flushed and fsync'ed, its sha256 (computed while writing, on
a helper thread) goes to ``<name>.sha256`` in ``sha256sum`` format (written the same way), both
are renamed into place (checksum first) and the folder is fsync'ed. A crash mid-save leaves at
most a ``.tmp`` file; the previous file stays valid. With ``plain_only`` (``cbtorch.save`` of a
script's object) the object is refused, before a byte is written, when ``weights_only`` could
not read it back (a module, a function, an arbitrary object).

Reading (:func:`read_mdl`) checks the file against its checksum (hashed on a helper thread while
torch parses it with ``weights_only=True``; nothing parsed is returned unless the checksum
matches); a mismatch, a truncated file or a file torch cannot load is a :class:`CheckpointError`
naming the path. A file without a checksum (made elsewhere, or whose sidecar was lost) is still
verified: a ``.mdl`` is a zip archive whose every member carries a CRC-32, which ``torch.load``
does not check (a flipped bit in a tensor loads silently); the helper thread checks every
member's CRC instead, and such a file loads with a one-line notice that it was verified by CRC
only.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import queue
import re
import threading
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import torch

from csrun.errors import EnvironmentFailure, UserError, describe_os_error, os_error_in
from csrun.files import fsync_folder, write_temporary

log = logging.getLogger("csrun.run")

SUFFIX_SHA = ".sha256"
"""The checksum file beside a ``.mdl`` file: ``<name>.sha256``."""
_QUEUE_CHUNKS = 64
"""Chunks waiting for the hash thread before the writer blocks (bounds the extra memory)."""
_READ_CHUNK = 8 << 20
"""Bytes per read when hashing a file on load."""


class CheckpointError(UserError):
    """A checkpoint file that cannot be written as data or used (missing, corrupt, truncated, not data)."""

    exit_code = 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class _Hasher:
    """sha256 on a helper thread (hashlib releases the GIL), fed chunks in order."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()
        self._q: "queue.Queue[bytes | None]" = queue.Queue(maxsize=_QUEUE_CHUNKS)
        self._thread = threading.Thread(target=self._run, name="csrun-checkpoint-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._q.get()) is not None:
            self.sha.update(chunk)

    def update(self, chunk: Any) -> None:
        """Hash ``chunk`` (kept alive until hashed)."""
        self._q.put(chunk)

    def hexdigest(self) -> str:
        """Wait for the queued chunks; the digest."""
        self._q.put(None)
        self._thread.join()
        return self.sha.hexdigest()


class _HashingWriter:
    """A binary file wrapper that hashes, on a helper thread, what is written through it.

    torch.save hands over memoryviews of buffers it may reuse, so each chunk is copied
    once; the copy is written here and hashed there, overlapping serialisation and hashing.
    """

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.hasher = _Hasher()

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self.hasher.update(chunk)
        return self.f.write(chunk)

    def flush(self) -> None:
        self.f.flush()


def write_mdl(path: str | os.PathLike[str], state: Any, *, plain_only: bool = False) -> Path:
    """Write ``state`` atomically as the ``.mdl`` file ``path`` with its checksum (module manual).

    ``plain_only``: refuse (:class:`CheckpointError`) an object ``weights_only`` could not read
    back, before writing. A failed write (disk full, not writable, a folder in the way) is an
    :class:`~csrun.errors.EnvironmentFailure` naming the file and the OS's reason; the temporary
    files are removed and an earlier file of that name is untouched."""
    final = Path(path)
    data = _plain_bytes(final, state) if plain_only else None
    sha_file = final.with_name(final.name + SUFFIX_SHA)
    written: list[Path] = []
    try:
        if data is not None:
            written.append(write_temporary(final, data))
            digest = hashlib.sha256(data).hexdigest()
        else:
            hashed: list[str] = []
            written.append(write_temporary(final, lambda f: hashed.append(_save_hashed(state, f))))
            digest = hashed[0]
        written.append(write_temporary(sha_file, f"{digest}  {final.name}\n".encode()))
        if final.is_dir():
            raise EnvironmentFailure(f"cannot save checkpoint {final}: a folder of that name is in the way; "
                                     f"earlier checkpoints are intact")
        os.replace(written[1], sha_file)
        os.replace(written[0], final)
        fsync_folder(final.parent)
    except (OSError, RuntimeError) as exc:  # torch reports a failed write as a RuntimeError around the OSError
        err = os_error_in(exc)
        if err is None:
            raise
        raise EnvironmentFailure(f"cannot save checkpoint {final}: {describe_os_error(err)}; "
                                 f"earlier checkpoints are intact") from None
    finally:
        for t in written:
            t.unlink(missing_ok=True)
    return final


def _plain_bytes(path: Path, state: Any) -> bytes:
    """``state`` serialized, when ``weights_only`` reads it back (else :class:`CheckpointError`)."""
    buf = io.BytesIO()
    try:
        torch.save(state, buf)
        buf.seek(0)
        torch.load(buf, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch reports an unsupported object in many ways
        raise CheckpointError(f"cannot save {path}: the object is not plain data (tensors, dicts, lists, numbers, "
                              f"strings): {_not_plain(exc)}") from None
    return buf.getvalue()


def _save_hashed(state: Any, f: BinaryIO) -> str:
    """``torch.save`` of ``state`` into ``f``, hashed while it is written; the sha256."""
    w = _HashingWriter(f)
    try:
        torch.save(state, w)  # type: ignore[arg-type]
    finally:
        digest = w.hasher.hexdigest()
    return digest


def _expected_digest(path: Path) -> str | None:
    sha_file = path.with_name(path.name + SUFFIX_SHA)
    try:
        text = sha_file.read_text().split()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"checkpoint {path}: cannot read its checksum file {sha_file}: {exc}") from None
    if not text or not re.fullmatch(r"[0-9a-f]{64}", text[0]):
        raise CheckpointError(f"checkpoint {path}: its checksum file {sha_file} is not a sha256 line")
    return text[0]


def _corrupt(path: Path) -> CheckpointError:
    return CheckpointError(f"checkpoint {path} is corrupt or truncated: its sha256 does not match "
                           f"{path.name}{SUFFIX_SHA}")


def _hash_file(path: Path, out: list[Any]) -> None:
    """sha256 of the file at ``path`` into ``out`` (or the OSError), reading 8 MiB at a time."""
    sha = hashlib.sha256()
    buf = bytearray(_READ_CHUNK)
    view = memoryview(buf)
    try:
        with open(path, "rb") as f:
            while n := f.readinto(buf):
                sha.update(view[:n])
        out.append(sha.hexdigest())
    except OSError as exc:
        out.append(exc)


def _check_zip_crcs(path: Path, out: list[Any]) -> None:
    """Check every member's CRC-32 of the checkpoint archive at ``path``; into ``out``:
    None when all match, else a one-line reason (or the OSError)."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
        out.append(None if bad is None else f"member {bad!r} fails its CRC-32")
    except OSError as exc:
        out.append(exc)
    except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError) as exc:
        out.append(f"not a whole zip archive ({str(exc).strip() or type(exc).__name__})")


def read_mdl(path: str | os.PathLike[str], *, map_location: Any = "cpu") -> Any:
    """What the ``.mdl`` file ``path`` holds (checksum verified, weights-only load; module manual).

    The checksum (or, without a checksum file, every zip member's CRC-32) is checked on a
    helper thread while torch parses the file; nothing parsed is returned unless the check passes.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path}: no such file")
    expected = _expected_digest(path)
    result: list[Any] = []
    verify = _hash_file if expected is not None else _check_zip_crcs
    hasher = threading.Thread(target=verify, args=(path, result), name="csrun-checkpoint-verify", daemon=True)
    hasher.start()
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
        error = None
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds for a bad file; all mean "unusable"
        state, error = None, exc
    hasher.join()
    if isinstance(result[0], OSError):
        raise CheckpointError(f"checkpoint {path}: cannot read it: {result[0]}")
    if expected is None:
        if result[0] is not None:
            raise CheckpointError(f"checkpoint {path} is corrupt or truncated (no {SUFFIX_SHA} file; "
                                  f"checked by zip CRC): {result[0]}")
        log.warning("checkpoint %s has no %s file: verified by its zip CRCs only", path, SUFFIX_SHA)
    elif result[0] != expected:
        raise _corrupt(path)
    if error is not None:
        raise CheckpointError(f"checkpoint {path}: not a weights-only checkpoint, it cannot be read as data "
                              f"({_why_not_data(error)}); nothing in it was run")
    return state


def _not_plain(error: BaseException) -> str:
    """What in an object to save is not plain data, without torch's advice on loading unsafely."""
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(error))
    if found:
        return f"it holds a {found.group(1)}"
    first = _first_line(error)
    return "a value torch cannot read back as data" if "weights_only" in first.lower() or "load" in first.lower() \
        else first


def _why_not_data(error: BaseException) -> str:
    """Why torch refused to read a file as data, without torch's advice to load it as code."""
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(error))
    if found:
        return f"it holds a pickled Python object, {found.group(1)}"
    return "it is not a torch.save archive of tensors and plain values"
