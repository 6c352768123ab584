"""``cerebras.appliance.utils.file``: ``create_symlink``, replacing a link that is already there."""

from __future__ import annotations

import os
from pathlib import Path


def create_symlink(dst: str | os.PathLike[str], src: str | os.PathLike[str], target_is_directory: bool = False) -> None:
    """Make ``dst`` a symbolic link to ``src``, atomically replacing an older link at ``dst``.

    A ``dst`` that exists and is not a link is left alone and raises ``FileExistsError``.
    """
    dst = Path(dst)
    if dst.exists() and not dst.is_symlink():
        raise FileExistsError(f"{dst} exists and is not a symbolic link; not replacing it")
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.link")
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(src, tmp, target_is_directory=target_is_directory)
    os.replace(tmp, dst)


__all__ = ["create_symlink"]
