"""A csrun error the user can fix that ends a script is one line, not a traceback.

The user APIs (cbtorch, cstorch, and the legacy names) raise :class:`~csrun.errors.UserError`
for what a script asked and csrun cannot do; the message says what and the fix. Raised through
the script's own code and not caught, Python would print a traceback of csrun's internals
around it. :func:`install` (run when :mod:`csrun.torch` is imported) puts a hook in front of
``sys.excepthook``: such an error prints ``<script>: error: <message> (at <file>:<line>)``, the
line being the script's own call that led to it, and the process exits 1 as Python's uncaught
exceptions do. Any other exception goes to the hook that was there (a script's own hook, such as
the Model Zoo's logging hook, still sees every other error; installed after csrun's, it wraps it).
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from types import TracebackType

from csrun.errors import UserError

_PACKAGE = str(Path(__file__).resolve().parents[1])


def _where(tb: TracebackType | None) -> str:
    """``file:line`` of the last frame outside csrun (the script's call), or ``""``."""
    last = ""
    for frame in traceback.extract_tb(tb):
        if not os.path.abspath(frame.filename).startswith(_PACKAGE):
            last = f"{frame.filename}:{frame.lineno}"
    return last


def install() -> None:
    """Put the one-line hook in front of ``sys.excepthook`` (once)."""
    if getattr(sys.excepthook, "__csrun_user_errors__", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if isinstance(error, UserError):
            where = _where(tb)
            prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
            sys.stderr.write(f"{prog}: error: {error}{f' (at {where})' if where else ''}\n")
            sys.stderr.flush()
            return
        previous(kind, error, tb)

    hook.__csrun_user_errors__ = True  # type: ignore[attr-defined]
    sys.excepthook = hook


__all__ = ["install"]
