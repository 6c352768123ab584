"""Reading the converter's text input: files (or globs) of documents, one sentence per line.

The format is BERT's ``create_pretraining_data`` input: UTF-8 text, one sentence (or line of
text) per line, documents separated by one or more blank lines; the end of a file also ends a
document. Leading/trailing whitespace on a line is ignored.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Sequence

from csrun.data.errors import DataError

_GLOB_CHARS = set("*?[")


def expand_inputs(patterns: Sequence[str]) -> list[Path]:
    """The files that ``patterns`` (paths or globs) name, in the order given, each once."""
    if not patterns:
        raise DataError("no --input given: name one or more text files or globs")
    found: list[Path] = []
    for pattern in patterns:
        if _GLOB_CHARS & set(pattern):
            matches = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
            if not matches:
                raise DataError(f"--input {pattern!r} matches no file")
            found.extend(matches)
        else:
            path = Path(pattern)
            if not path.exists():
                raise DataError(f"--input {pattern!r}: no such file")
            if not path.is_file():
                raise DataError(f"--input {pattern!r} is not a file")
            found.append(path)
    return list(dict.fromkeys(found))


def read_documents(paths: Sequence[Path]) -> list[list[str]]:
    """Documents (lists of non-empty lines) from ``paths``; :class:`DataError` when there is no text."""
    documents: list[list[str]] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"--input {str(path)!r} is not UTF-8 text ({exc.reason} at byte "
                            f"{exc.start})") from None
        except OSError as exc:
            raise DataError(f"cannot read --input {str(path)!r}: {exc.strerror}") from None
        current: list[str] = []
        for line in text.splitlines():
            line = line.strip()
            if line:
                current.append(line)
            elif current:
                documents.append(current)
                current = []
        if current:
            documents.append(current)
    if not documents:
        raise DataError(f"--input holds no text: {', '.join(repr(str(p)) for p in paths)} "
                        "contain only blank lines")
    return documents
