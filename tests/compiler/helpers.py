"""Shared test helpers: line numbers computed from source, default settings, a quiet console."""

from __future__ import annotations

import inspect
import io
import os
from typing import Any

from rich.console import Console

from csrun.compiler import CompileSettings

SETTINGS = CompileSettings(mode="train", learning_rate=1e-3)


def line_of(obj: Any, needle: str) -> int:
    """The file line number of the first line of ``obj``'s source containing ``needle``."""
    lines, start = inspect.getsourcelines(obj)
    for i, text in enumerate(lines):
        if needle in text:
            return start + i
    raise AssertionError(f"{needle!r} not in the source of {obj!r}")


def here() -> int:
    """The caller's current line."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


def same_file(a: str | None, b: str) -> bool:
    """Two paths name the same file."""
    return a is not None and os.path.abspath(a) == os.path.abspath(b)


def console() -> tuple[Console, io.StringIO]:
    """A rich console writing to a buffer (wide, no colour)."""
    buf = io.StringIO()
    return Console(file=buf, width=200, color_system=None), buf
