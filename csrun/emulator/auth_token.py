"""The shared secret between ``cs_emulator`` and its clients.

Both sides read ``CSRUN_EMULATOR_TOKEN`` first, then a token file (default
``~/.csrun/emulator.token``). Only the server creates the file, when neither exists: a fresh
:func:`secrets.token_urlsafe` value written with mode 0600.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from csrun.errors import UserError

TOKEN_ENV = "CSRUN_EMULATOR_TOKEN"
"""Environment variable holding the token (takes precedence over the file)."""
DEFAULT_TOKEN_FILE = "~/.csrun/emulator.token"
"""Where the token lives when the environment does not give it."""


def _from_file(path: Path) -> str | None:
    if not path.exists():
        return None
    token = path.read_text().strip()
    if not token:
        raise UserError(f"token file {path} is empty; delete it to get a fresh token, or set {TOKEN_ENV}")
    return token


def server_token(token_file: str | None = None) -> tuple[str, str | None]:
    """The server's token; generates and writes the file (mode 0600) when there is none.

    Returns (token, path of a newly written file or None).
    """
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        return env, None
    path = Path(token_file or DEFAULT_TOKEN_FILE).expanduser()
    token = _from_file(path)
    if token is not None:
        return token, None
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, str(path)


def client_token(token_file: str | None = None) -> str:
    """The token a client presents: ``CSRUN_EMULATOR_TOKEN``, else the token file."""
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        return env
    path = Path(token_file or DEFAULT_TOKEN_FILE).expanduser()
    token = _from_file(path)
    if token is None:
        raise UserError(
            f"no emulator token: set {TOKEN_ENV} or put the token cs_emulator printed in {path}"
        )
    return token
