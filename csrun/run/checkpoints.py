"""Checkpoints in model_dir: ``checkpoint_<step>.mdl`` plus ``checkpoint_<step>.mdl.sha256``.

A checkpoint is ``torch.save`` of a dict of plain data (tensors, dicts, lists, numbers,
strings, None) so that :func:`load_checkpoint` can read it with ``torch.load(weights_only=True)``
— checkpoints are untrusted files and are never fully unpickled. Keys written by the runner:

``model``          the model's state dict
``optimizer``      the optimizer's state dict
``lr_scheduler``   ``{"global_step": N}`` (the schedule is a pure function of the global step)
``amp``            loss-scaling state (empty on the CPU path)
``global_step``    optimizer steps taken
``data_position``  global batch index of the next batch (``loader.skip`` on resume)

Writing is atomic: the file is written under a temporary name in the same folder, flushed
and fsync'ed, its sha256 (computed while writing) goes to ``<name>.sha256`` in
``sha256sum`` format (written the same way), both are renamed into place (checksum first)
and the folder is fsync'ed. A crash mid-save leaves at most a ``.tmp`` file, which is never
counted as a checkpoint; the previous checkpoint stays valid.

Reading checks the file against its checksum (hashed on a helper thread while torch parses
it with ``weights_only=True``; nothing parsed is used unless the checksum matches); a
mismatch, a truncated file or a file torch cannot load is a :class:`CheckpointError` naming
the path. A checkpoint without a checksum file (e.g. one made elsewhere, or whose sidecar was
lost) is still verified: a checkpoint is a zip archive whose every member carries a CRC-32,
which ``torch.load`` does not check (a flipped bit in a tensor loads silently); the helper
thread checks every member's CRC instead of the sha256, and a mismatch or a damaged archive is
refused like a checksum mismatch (``--resume`` then falls back to an older checkpoint). Such a
checkpoint loads with a one-line notice that it was verified by CRC only.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import re
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from csrun.errors import EnvironmentFailure, UserError, describe_os_error, os_error_in

log = logging.getLogger("csrun.run")

CHECKPOINT_RE = re.compile(r"^checkpoint_(\d+)\.mdl$")
"""Names counted as checkpoints."""
SUFFIX_SHA = ".sha256"
_QUEUE_CHUNKS = 64
"""Chunks waiting for the hash thread before the writer blocks (bounds the extra memory)."""
_READ_CHUNK = 8 << 20
"""Bytes per read when hashing a checkpoint on load."""


class CheckpointError(UserError):
    """A checkpoint that cannot be used (missing, corrupt, truncated, wrong content)."""

    exit_code = 1


def checkpoint_path(model_dir: Path, step: int) -> Path:
    """``model_dir/checkpoint_<step>.mdl``."""
    return Path(model_dir) / f"checkpoint_{step}.mdl"


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


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not every file system lets a folder be opened
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, write: Any) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(model_dir: Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically as ``checkpoint_<step>.mdl`` with its checksum; return the path.

    A failed write (disk full, not writable, a folder in the way) is an
    :class:`~csrun.errors.EnvironmentFailure` naming the checkpoint and the OS's reason; the
    temporary files are removed and earlier checkpoints are untouched."""
    folder = Path(model_dir)
    folder.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(folder, step)
    tmp = folder / f".{final.name}.{os.getpid()}.tmp"
    tmp_sha = folder / f".{final.name}{SUFFIX_SHA}.{os.getpid()}.tmp"
    digest = ""
    try:
        def write_state(f: BinaryIO) -> None:
            nonlocal digest
            w = _HashingWriter(f)
            try:
                torch.save(state, w)  # type: ignore[arg-type]
            finally:
                digest = w.hasher.hexdigest()

        _write_file(tmp, write_state)
        _write_file(tmp_sha, lambda f: f.write(f"{digest}  {final.name}\n".encode()))
        if final.is_dir():
            raise EnvironmentFailure(f"cannot save checkpoint {final}: a folder of that name is in the way; "
                                     f"earlier checkpoints are intact")
        os.replace(tmp_sha, folder / (final.name + SUFFIX_SHA))
        os.replace(tmp, final)
        _fsync_dir(folder)
    except (OSError, RuntimeError) as exc:  # torch reports a failed write as a RuntimeError around the OSError
        err = os_error_in(exc)
        if err is None:
            raise
        raise EnvironmentFailure(f"cannot save checkpoint {final}: {describe_os_error(err)}; "
                                 f"earlier checkpoints are intact") from None
    finally:
        for t in (tmp, tmp_sha):
            if t.exists():
                t.unlink()
    return final


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


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The state dict in checkpoint ``path`` (checksum verified, weights-only load).

    The checksum (or, without a checksum file, every zip member's CRC-32) is checked on a
    helper thread while torch parses the file (``weights_only=True`` is safe on untrusted
    input); nothing parsed is returned unless the check passes.
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
        state = torch.load(path, map_location="cpu", weights_only=True)
        error = None
    except Exception as exc:  # torch raises many kinds for a bad file; all mean "unusable"
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
        text = str(error).strip()
        first = text.splitlines()[0] if text else type(error).__name__
        raise CheckpointError(f"checkpoint {path}: cannot load it as a weights-only checkpoint: {first}")
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"checkpoint {path}: not a csrun checkpoint (no 'model' entry)")
    return state


@dataclass(frozen=True)
class Found:
    """A checkpoint picked for ``--resume``."""

    path: Path
    step: int
    state: dict[str, Any]
    skipped: tuple[str, ...] = ()
    """One line per newer checkpoint that could not be used, and why."""


def list_checkpoints(model_dir: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``checkpoint_<step>.mdl`` in ``model_dir``, newest first."""
    folder = Path(model_dir)
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = CHECKPOINT_RE.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(1)), p))
    return sorted(found, reverse=True)


def latest_valid(model_dir: Path) -> Found | None:
    """The newest checkpoint in ``model_dir`` that verifies and loads; None when there is none."""
    skipped: list[str] = []
    for step, path in list_checkpoints(model_dir):
        try:
            state = load_checkpoint(path)
        except CheckpointError as exc:
            skipped.append(str(exc))
            continue
        return Found(path=path, step=step, state=state, skipped=tuple(skipped))
    if skipped:
        raise CheckpointError("--resume: no valid checkpoint in " + str(model_dir) + ": " + "; ".join(skipped))
    return None


def prune_checkpoints(model_dir: Path, keep: int, *, protect: tuple[int, ...] = ()) -> list[int]:
    """Delete all but the newest ``keep`` checkpoints (with their ``.sha256``) of ``model_dir``;
    steps in ``protect`` (the one a run resumed from) are never deleted. ``keep`` 0 keeps all.
    Returns the steps deleted."""
    if keep <= 0:
        return []
    deleted = []
    for step, path in list_checkpoints(model_dir)[keep:]:
        if step in protect:
            continue
        for target in (path, path.with_name(path.name + SUFFIX_SHA)):
            target.unlink(missing_ok=True)
        deleted.append(step)
    return deleted
