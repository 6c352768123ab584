"""A tensor frame whose shape holds no bytes but whose strides no tensor can hold (issue 45 item 5:
``[0, 2^40-1, 2^40-1]``): the wire refuses it as a protocol error, and cs_emulator closes that
connection with one logged reason, no traceback, and serves the next job."""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest

from csrun.emulator.remote import wire
from csrun.emulator.remote.errors import ProtocolError
from csrun.emulator.remote.server import EmulatorServer

from .conftest import TOKEN, connect_when_free
from .helpers import raw_hello

HUGE_EMPTY = [0, 2**40 - 1, 2**40 - 1]


def _frame(header: dict) -> bytes:
    raw = json.dumps(header).encode()
    return wire.MAGIC + len(raw).to_bytes(4, "big") + raw


class _Bytes:
    """A link that yields the given bytes, then the end of the stream."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)

    def recv_into(self, buffer: memoryview, nbytes: int = 0) -> int:
        n = min(nbytes or len(buffer), len(self.data))
        buffer[:n] = self.data[:n]
        self.data = self.data[n:]
        return n


@pytest.mark.parametrize("shape", [HUGE_EMPTY, [2**40 - 1, 0, 2**40 - 1], [0] + [2**39] * 15, [0, 2**31, 2**32]])
def test_an_empty_tensor_whose_strides_overflow_is_a_protocol_error(shape: list[int]) -> None:
    link = _Bytes(_frame({"op": "step", "tensors": [{"dtype": "float32", "shape": shape}]}))
    with pytest.raises(ProtocolError, match=r"^empty tensor of shape \[.*\]: its strides do not fit in 64 bits$"):
        wire.recv_frame(link, wire.Limits())


@pytest.mark.parametrize("shape", [[0, 128], [2**30, 0], [0, 2**32, 2**31 - 1]])
def test_an_empty_tensor_whose_strides_fit_still_travels(shape: list[int]) -> None:
    header, tensors = wire.recv_frame(_Bytes(_frame({"op": "x", "tensors": [{"dtype": "int32", "shape": shape}]})),
                                      wire.Limits())
    assert header["op"] == "x" and list(tensors[0].shape) == shape


def test_the_server_closes_such_a_frame_in_one_line_and_goes_on(server: EmulatorServer,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    host, port = server.address[:2]
    with socket.create_connection((host, port), timeout=10) as sock:
        assert raw_hello(sock, TOKEN, "hostile")["op"] == "ok"
        sock.sendall(_frame({"op": "step", "seq": 1, "batch": {"$t": 0},
                             "tensors": [{"dtype": "float32", "shape": HUGE_EMPTY}]}))
        deadline = time.monotonic() + 30
        while not any("empty tensor of shape" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the server logged no reason"
            time.sleep(0.02)
    closing = [r for r in caplog.records if "empty tensor of shape" in r.getMessage()]
    assert len(closing) == 1 and closing[0].levelno == logging.WARNING and closing[0].exc_info is None
    assert "\n" not in closing[0].getMessage() and "closing the connection" in closing[0].getMessage()
    connect_when_free(server, "next").close()  # the system is free for the next job
