"""The shared secret between ``cs_emulator`` and its clients, and what makes one acceptable.

Both sides read ``CSRUN_EMULATOR_TOKEN`` first, then a token file (default
``~/.csrun/emulator.token``). Only the server creates the file, when neither exists: a fresh
:func:`secrets.token_urlsafe` value (43 characters, 256 bits) written with mode 0600.

The token never travels (:mod:`csrun.emulator.remote.handshake` proves knowledge of it with HMAC), but
anyone who records a hello can test guesses offline, so the server refuses a token shorter than
:data:`MIN_TOKEN_CHARS` characters or one whose characters repeat so much that it carries less
than :data:`MIN_TOKEN_BITS` bits by a character-frequency estimate (:func:`token_problem`). A
token file, like a TLS key, must be readable by its owner only (:func:`private_file_problem`);
both sides refuse a file that its group or others can read.
"""

from __future__ import annotations

import math
import os
import secrets
import stat
from collections import Counter
from pathlib import Path

from csrun.env_settings import env_name, env_settings
from csrun.emulator.remote.errors import InsecureSetup
from csrun.errors import UserError

TOKEN_ENV = env_name("emulator_token")
"""Environment variable holding the token (takes precedence over the file)."""
DEFAULT_TOKEN_FILE = "~/.csrun/emulator.token"
"""Where the token lives when the environment does not give it."""
MIN_TOKEN_CHARS = 16
"""Shortest token the server accepts (without ``--allow-weak-token``)."""
MIN_TOKEN_BITS = 48.0
"""Least estimated entropy (character frequencies times length) the server accepts."""


def new_token() -> str:
    """A fresh strong token (256 random bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def token_bits(token: str) -> float:
    """An optimistic entropy estimate: the length times the Shannon entropy of the character counts."""
    if not token:
        return 0.0
    n = len(token)
    return abs(-sum(c * math.log2(c / n) for c in Counter(token).values()))  # abs: no "-0" for one repeated character


def token_problem(token: str) -> str | None:
    """Why ``token`` is too weak to serve with, or None when it is acceptable."""
    if len(token) < MIN_TOKEN_CHARS:
        return f"is {len(token)} characters long; at least {MIN_TOKEN_CHARS} are needed"
    bits = token_bits(token)
    if bits < MIN_TOKEN_BITS:
        return f"repeats its characters too much (about {bits:.0f} bits; at least {MIN_TOKEN_BITS:.0f} are needed)"
    return None


def check_token(token: str, source: str) -> None:
    """Raise :class:`InsecureSetup` naming ``source`` when ``token`` is too weak."""
    problem = token_problem(token)
    if problem is not None:
        raise InsecureSetup(
            f"the token from {source} {problem}; generate one with "
            f"`python -c 'import secrets; print(secrets.token_urlsafe(32))'` (or pass --allow-weak-token)"
        )


def private_file_problem(path: Path) -> str | None:
    """Why ``path`` is not private to its owner (group or others may read or write it), or None."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return f"{path} is readable or writable by its group or others (mode {mode:04o}); run `chmod 600 {path}`"
    return None


def check_private_file(path: Path, what: str) -> None:
    """Raise :class:`InsecureSetup` when ``path`` (a ``what``: token file, TLS key) is not private."""
    problem = private_file_problem(path)
    if problem is not None:
        raise InsecureSetup(f"the {what} {problem}")


def _from_file(path: Path) -> str | None:
    if not path.exists():
        return None
    check_private_file(path, "token file")
    token = path.read_text().strip()
    if not token:
        raise UserError(f"token file {path} is empty; delete it to get a fresh token, or set {TOKEN_ENV}")
    return token


def server_token(token_file: str | None = None) -> tuple[str, str, str | None]:
    """The server's token; generates and writes the file (mode 0600) when there is none.

    Returns (token, where it came from, path of a newly written file or None). A token file
    that its group or others can read is refused (:class:`InsecureSetup`).
    """
    env = env_settings().emulator_token.strip()
    if env:
        return env, TOKEN_ENV, None
    path = Path(token_file or DEFAULT_TOKEN_FILE).expanduser()
    token = _from_file(path)
    if token is not None:
        return token, str(path), None
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = new_token()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, str(path), str(path)


def client_token(token_file: str | None = None) -> str:
    """The token a client presents: ``CSRUN_EMULATOR_TOKEN``, else the (private) token file."""
    env = env_settings().emulator_token.strip()
    if env:
        return env
    path = Path(token_file or DEFAULT_TOKEN_FILE).expanduser()
    token = _from_file(path)
    if token is None:
        raise UserError(
            f"no emulator token: set {TOKEN_ENV} or put the token cs_emulator printed in {path}"
        )
    return token
