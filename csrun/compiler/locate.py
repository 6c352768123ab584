"""Find the user's file and line: in a traceback, on the live stack, or in a class.

"User code" is any file outside the torch package, outside the Python standard library and
outside csrun itself. The source line comes from :mod:`linecache`.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import os
import sys
import sysconfig
import traceback
from types import FrameType, TracebackType

import torch

from csrun.compiler.errors import Location

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_CSRUN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    """True for a file of the user's (not torch, not the standard library, not csrun); remembered
    per file name (it runs for every frame a refusal or a step's bookkeeping walks)."""
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    if path.startswith(_TORCH_DIR) or path.startswith(_CSRUN_DIR):
        return False
    if any(path.startswith(d) and "site-packages" not in path for d in _STDLIB_DIRS):
        return False
    return True


def location_of(filename: str, lineno: int, function: str = "") -> Location:
    """A :class:`Location` with the stripped source line filled in."""
    return Location(filename=os.path.abspath(filename), lineno=lineno, function=function,
                    source_line=linecache.getline(filename, lineno).strip())


def user_frame_in_traceback(tb: TracebackType | None) -> Location | None:
    """The innermost user frame of a traceback (where the user's code was when it failed)."""
    found = None
    for fs in traceback.extract_tb(tb):
        if is_user_file(fs.filename):
            found = location_of(fs.filename, fs.lineno or 0, fs.name)
    return found


def user_frame_in_exception(exc: BaseException) -> Location | None:
    """The user's frame for an exception: its own traceback, then its causes/contexts.

    torch.export also prints ``The following call raised this error: File "...", line N``;
    that text is parsed when no traceback frame is the user's.
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        loc = user_frame_in_traceback(e.__traceback__)
        if loc is not None:
            return loc
        e = e.__cause__ or e.__context__
    return user_frame_in_message(str(exc))


def user_frame_in_message(text: str) -> Location | None:
    """The innermost user frame a text names as torch prints them (``File "x.py", line N, in f``)."""
    import re

    for m in reversed(list(re.finditer(r'File "([^"]+)", line (\d+), in (\S+)', text))):
        if is_user_file(m.group(1)):
            return location_of(m.group(1), int(m.group(2)), m.group(3))
    return None


def caller_location(skip_files: tuple[str, ...] = ()) -> Location | None:
    """The innermost user frame on the current stack (who called into csrun)."""
    site = _user_site(sys._getframe(1), skip_files)
    return location_of(*site) if site is not None else None


Site = tuple[str, int, str]
"""(file, line, function) of a frame: a :class:`Location` to be, without its source line."""


def caller_site(skip_files: tuple[str, ...] = ()) -> Site | None:
    """:func:`caller_location` without reading the source line (what a step's bookkeeping keeps
    on the hot path; :func:`location_of` makes it a :class:`Location` when a message needs it)."""
    return _user_site(sys._getframe(1), skip_files)


def _user_site(frame: FrameType | None, skip_files: tuple[str, ...]) -> Site | None:
    while frame is not None:
        fn = frame.f_code.co_filename
        if is_user_file(fn) and fn not in skip_files:
            return fn, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return None


def definition_location(obj: object) -> Location | None:
    """Where a class or function is defined (its ``def``/``class`` line), or None."""
    try:
        filename = inspect.getsourcefile(obj)  # type: ignore[arg-type]
        _, lineno = inspect.getsourcelines(obj)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return None
    if filename is None:
        return None
    return location_of(filename, lineno, getattr(obj, "__qualname__", ""))


def attribute_location(cls: type, name: str) -> Location | None:
    """Where a class's own source assigns ``self.<name>`` (the line that makes a submodule), or None."""
    for klass in cls.__mro__:
        if not is_user_file(getattr(sys.modules.get(klass.__module__), "__file__", "") or ""):
            continue
        try:
            lines, start = inspect.getsourcelines(klass)
            filename = inspect.getsourcefile(klass)
        except (OSError, TypeError):
            continue
        for i, text in enumerate(lines):
            stripped = text.strip()
            if stripped.startswith(f"self.{name}") and "=" in stripped.split("(")[0] and filename:
                return location_of(filename, start + i, "__init__")
    return None
