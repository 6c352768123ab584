"""The small hierarchy of errors csrun raises for things a user can fix.

Every command catches :class:`UserError` at its top level, prints ``<command>: error: <message>``
and exits with the error's ``exit_code`` (2 for bad input), so a user never sees a Python
traceback for a mistake of theirs. Messages name the bad value and say what would be right.

:class:`ConfigError` is the one error for a bad configuration key or value, wherever it is
read: the site config, launcher option values, the params YAML (and run.py's overrides of
it), an input section, compile settings. It exits 2 from every command, like any other bad
input; ``csrun.typed_config`` and ``csrun.compiler.errors`` name this same class.
"""

from __future__ import annotations

from typing import Any


class UserError(Exception):
    """A mistake the user can fix: bad flag, bad value, bad config, missing tool."""

    exit_code: int = 2


class UsageError(UserError):
    """A command-line option or value that the command does not accept."""


class ConfigError(UserError):
    """A config key or value that does not fit; the message names its path and the valid choices.

    ``fix`` (optional) says what to do instead and ``location`` (optional, anything whose
    ``str`` is a source position with ``filename``/``lineno``) where the value came from;
    both are added to the message, as a compile problem shows them.
    """

    exit_code = 2

    def __init__(self, what: str, *, fix: str | None = None, location: Any = None) -> None:
        self.what = what
        self.fix = fix or ""
        self.location = location
        super().__init__(self.render())

    @property
    def filename(self) -> str | None:
        """The file the bad value came from, or None."""
        return getattr(self.location, "filename", None)

    @property
    def lineno(self) -> int | None:
        """The line in :attr:`filename`, or None."""
        return getattr(self.location, "lineno", None)

    def render(self) -> str:
        """The full message: location (when known), what is wrong, and the fix (when given)."""
        return located(self.location, self.what, self.fix)


def located(location: Any, what: str, fix: str = "") -> str:
    """A message about a place in the user's files, in the one form every refusal uses:
    ``file:line: what``, the source line indented below it when known, then ``Fix: ...``.
    ``location``: anything with ``filename`` and ``lineno`` (and maybe ``source_line``), or None."""
    filename, lineno = getattr(location, "filename", None), getattr(location, "lineno", None)
    head = f"{filename}:{lineno}: {what}" if filename and lineno else what
    source = getattr(location, "source_line", "")
    parts = [head, f"    {source}"] if source else [head]
    if fix:
        parts.append(f"Fix: {fix}")
    return "\n".join(parts)


class LaunchError(UserError):
    """A launch that cannot be built or started (impossible layout, missing launcher)."""

    exit_code = 1


class EnvironmentFailure(UserError):
    """The machine, not the input, failed: a disk full or not writable, a path that is a file
    where a folder belongs, a lost server. One line, exit 1; what was written before is intact."""

    exit_code = 1


def os_error_in(exc: BaseException) -> OSError | None:
    """The first :class:`OSError` in ``exc`` or its chain (``__cause__`` / ``__context__``): torch
    buries ENOSPC under ``RuntimeError: [enforce fail at inline_container.cc ...]``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def describe_os_error(err: OSError) -> str:
    """``<strerror> (<path>)`` for an OSError, naming both paths of a rename."""
    import errno as errno_names

    what = err.strerror or str(err) or type(err).__name__
    code = errno_names.errorcode.get(err.errno or 0)
    paths = [p for p in (err.filename, err.filename2) if p is not None]
    where = " -> ".join(str(p) for p in paths)
    return f"{what}{f' [{code}]' if code else ''}{f': {where}' if where else ''}"
