"""The device address: ``HOST[:PORT]`` parsed and checked once, for every place that takes one.

Forms accepted (surrounding blanks are ignored):

==================  ============================================================
``host``            port :data:`DEFAULT_PORT` (9000, the system's port)
``host:port``       a host name or IPv4 address and a port
``:port``           host :data:`DEFAULT_HOST` (127.0.0.1)
``[v6]:port``       an IPv6 address in brackets, e.g. ``[::1]:9000``
``[v6]`` / ``::1``  an IPv6 address without a port (port 9000)
==================  ============================================================

The host must be a host name (RFC 1123 labels; ``_`` allowed), an IPv4 or an IPv6 address: a
URL, a path, blanks or a 300-character word are refused. The port must be a whole number from 1 to 65535 (0 too with ``allow_zero``: "listen on a
free port"). A bad address raises :class:`AddressError`, one line that names the bad value
and shows a good one. :class:`Address` prints back as ``host:port`` (``[v6]:port``), the
form every command shows and the run's params record.

The run.py flag ``--cs_ip``, ``csrun.torch.initialize(cs_ip=...)``, ``CS_IP``, the
``cs_emulator --listen`` option and :class:`~csrun.emulator.remote.client.RemoteDevice` all parse
with :func:`parse_address`.
"""

from __future__ import annotations

import ipaddress
import re
from typing import NamedTuple

from csrun.errors import UserError

DEFAULT_PORT = 9000
"""The system's port, used when an address gives none."""
DEFAULT_HOST = "127.0.0.1"
"""The host of an address given as ``:PORT``."""

_EXAMPLE = "give HOST or HOST:PORT, e.g. 10.0.0.5:9000 or [::1]:9000"


class AddressError(UserError):
    """An address that is not ``HOST[:PORT]`` or whose port is out of range."""


class Address(NamedTuple):
    """A parsed address; unpacks as ``host, port``."""

    host: str
    """Host name, IPv4 address or IPv6 address (without brackets)."""
    port: int
    """TCP port (0 only where the caller allowed it: listen on a free port)."""

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _split(text: str) -> tuple[str, str]:
    """(host, port text) of an address; port text is "" when none is given."""
    if text.startswith("["):
        host, closed, rest = text[1:].partition("]")
        if not closed or not host:
            raise AddressError(f"bad IPv6 address {text!r}: write it in brackets, e.g. [::1]:9000")
        if rest and not rest.startswith(":"):
            raise AddressError(f"unexpected {rest!r} after the IPv6 address in {text!r}; {_EXAMPLE}")
        if rest == ":":
            raise AddressError(f"the address {text!r} ends with ':' but gives no port; {_EXAMPLE}")
        return host, rest[1:]
    if text.count(":") > 1:  # a bare IPv6 address: no port can be told apart
        return text, ""
    host, _, port = text.partition(":")
    if text.endswith(":"):
        raise AddressError(f"the address {text!r} ends with ':' but gives no port; {_EXAMPLE}")
    return host, port


_HOST = re.compile(r"(?=.{1,253}\.?$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
                   r"(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?")
"""A host name (labels of letters, digits, ``-`` and ``_``, at most 63 characters each, 253 in all) or an IPv4 address."""


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def parse_address(text: str, *, allow_zero: bool = False) -> Address:
    """``text`` as an :class:`Address` (forms in the module manual); :class:`AddressError` if bad."""
    if not isinstance(text, str):
        raise AddressError(f"the address must be text HOST[:PORT], got {type(text).__name__} {text!r}")
    text = text.strip()
    if not text:
        raise AddressError(f"the address is empty; {_EXAMPLE}")
    host, port_text = _split(text)
    if host and not (_HOST.fullmatch(host) if ":" not in host else _is_ipv6(host)):
        raise AddressError(f"bad host {host!r} in the address {text!r}: not a host name, IPv4 or IPv6 address; "
                           f"{_EXAMPLE}")
    if not port_text:
        return Address(host or DEFAULT_HOST, DEFAULT_PORT)
    if not port_text.isdigit():
        raise AddressError(f"bad port {port_text!r} in the address {text!r}: the port is a number; {_EXAMPLE}")
    port = int(port_text)
    low = 0 if allow_zero else 1
    if not low <= port <= 65535:
        raise AddressError(f"port {port} in the address {text!r} is out of range: use {low} to 65535")
    return Address(host or DEFAULT_HOST, port)
