"""The one error the data room raises: :class:`DataError`, a :class:`csrun.errors.UserError`.

Bad data, bad input settings and bad converter flags all raise it with a message that names
the bad value (a path, a flag, a config key) and says what would be right; commands turn it
into ``<command>: error: <message>`` and exit code 2.
"""

from __future__ import annotations

from csrun.errors import UserError


class DataError(UserError):
    """Data, input settings or converter flags that cannot be used (the message names the value)."""
