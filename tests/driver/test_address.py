"""csrun.address: the one HOST[:PORT] parser (good forms, and bad ones as one-line errors naming the value)."""

from __future__ import annotations

import pytest

from csrun.address import DEFAULT_PORT, Address, AddressError, parse_address
from csrun.errors import UserError


@pytest.mark.parametrize("text,host,port,shown", [
    ("node7", "node7", DEFAULT_PORT, "node7:9000"),
    ("  node7:9100 ", "node7", 9100, "node7:9100"),
    ("10.0.0.5:1", "10.0.0.5", 1, "10.0.0.5:1"),
    (":9200", "127.0.0.1", 9200, "127.0.0.1:9200"),
    ("[::1]:9001", "::1", 9001, "[::1]:9001"),
    ("[fe80::2]", "fe80::2", DEFAULT_PORT, "[fe80::2]:9000"),
    ("::1", "::1", DEFAULT_PORT, "[::1]:9000"),
    ("host:65535", "host", 65535, "host:65535"),
])
def test_good_forms(text: str, host: str, port: int, shown: str) -> None:
    address = parse_address(text)
    assert address == Address(host, port) and str(address) == shown
    assert parse_address(str(address)) == address  # what it prints parses back to itself
    h, p = address  # unpacks like the (host, port) pair sockets want
    assert (h, p) == (host, port)


@pytest.mark.parametrize("text,named", [
    ("", "empty"),
    ("   ", "empty"),
    ("node7:", "'node7:'"),
    ("node7:port", "'port'"),
    ("node7:-1", "'-1'"),
    ("node7:0", "port 0"),
    ("node7:65536", "port 65536"),
    ("node7:99999", "port 99999"),
    ("[::1", "'[::1'"),
    ("[]:9000", "'[]:9000'"),
    ("[::1]9000", "'9000'"),
    ("[::1]:", "'[::1]:'"),
    ("no de:9000", "'no de'"),
])
def test_bad_forms_are_one_line_errors_naming_the_value(text: str, named: str) -> None:
    with pytest.raises(AddressError) as exc:
        parse_address(text)
    message = str(exc.value)
    assert named in message and "\n" not in message
    assert isinstance(exc.value, UserError) and exc.value.exit_code == 2


def test_port_zero_only_where_allowed() -> None:
    assert parse_address("127.0.0.1:0", allow_zero=True) == Address("127.0.0.1", 0)
    with pytest.raises(AddressError, match="out of range: use 1 to 65535"):
        parse_address("127.0.0.1:0")


def test_not_text_is_refused() -> None:
    with pytest.raises(AddressError, match="got int 9000"):
        parse_address(9000)  # type: ignore[arg-type]
