"""Reading a YAML file a user gave (params, site config): its value, or one line saying why not.

Whatever the file holds — nothing, binary bytes, text that is not YAML, nesting deep enough to
exhaust the parser's recursion, a tag that would build a Python object, a size no config has —
and whatever the path names — a directory, a device that never ends (``/dev/zero``), a pipe —
:func:`read_yaml` returns plain data (``yaml.safe_load``: nothing in the file is run) or raises a
:class:`~csrun.errors.ConfigError` (exit 2) naming the file and the problem.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from csrun.errors import ConfigError, describe_os_error

MAX_BYTES = 16 << 20
"""The largest YAML file read (a params or site file is a few kilobytes)."""


def read_yaml(path: Path, what: str) -> Any:
    """The data in ``path`` (``what``: how to name it in an error, e.g. ``--params p.yaml``)."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "a device, pipe or socket"
            raise ConfigError(f"{what}: {kind}, not a file; give a YAML file")
        if info.st_size > MAX_BYTES:
            raise ConfigError(f"{what}: {info.st_size} bytes, more than any config holds ({MAX_BYTES} at most)")
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)  # a file that grew since: read no more than the limit
        if len(raw) > MAX_BYTES:
            raise ConfigError(f"{what}: more than any config holds ({MAX_BYTES} bytes at most)")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what}: no such file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what}: not UTF-8 text (byte {exc.start}: {exc.reason}); give a YAML file") from None
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read it: {describe_os_error(exc)}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{what}: not valid YAML{line}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{what}: nested too deeply to read; a config is a few levels of mappings") from None


__all__ = ["MAX_BYTES", "read_yaml"]
