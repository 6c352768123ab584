"""The wire format: structured values round-trip; limits refuse before reading."""

from __future__ import annotations

import math
import socket
import struct
import threading

import pytest
import torch

from csrun.emulator.remote import wire
from csrun.emulator.remote.errors import ProtocolError


def test_values_round_trip_through_a_socket() -> None:
    value = {
        "ids": torch.arange(6, dtype=torch.int32).reshape(2, 3),
        "half": torch.randn(3, dtype=torch.bfloat16),
        "empty": torch.empty(0, 4),
        "flag": torch.tensor(True),
        "nested": [(1, 2.5, "x"), {"inf": math.inf, "none": None}],
        "intkeys": {0: {"step": torch.tensor(3.0)}, 1: {}},
        "$weird": 1,
    }
    a, b = socket.socketpair()
    tensors: list[torch.Tensor] = []
    head = {"op": "step", "v": wire.encode(value, tensors)}
    t = threading.Thread(target=wire.send_frame, args=(a, head, tensors))
    t.start()
    got_head, got_tensors = wire.recv_frame(b, wire.Limits())
    t.join()
    got = wire.decode(got_head["v"], got_tensors)
    assert torch.equal(got["ids"], value["ids"]) and got["ids"].dtype == torch.int32
    assert torch.equal(got["half"], value["half"]) and got["empty"].shape == (0, 4)
    assert got["flag"].item() is True
    assert got["nested"][0] == (1, 2.5, "x") and got["nested"][1]["inf"] == math.inf
    assert set(got["intkeys"]) == {0, 1} and got["intkeys"][0]["step"].item() == 3.0
    assert got["$weird"] == 1
    a.close()
    b.close()


def _body(text: bytes) -> bytes:
    return struct.pack(">I", len(text)) + text


@pytest.mark.parametrize("raw,needle", [
    (b"XXXX" + struct.pack(">I", 2), "magic"),
    (wire.MAGIC + struct.pack(">I", 1 << 30), "over the limit"),
    (wire.MAGIC + struct.pack(">I", 4) + b"null", "not a JSON object"),
    (wire.MAGIC + _body(b'{"tensors":[{"dtype":"float32","shape":[99999999]}]}'), "over the limit"),
    (wire.MAGIC + _body(b'{"tensors":[{"dtype":"object","shape":[]}]}'), "malformed"),
    (wire.MAGIC + _body(b'{"tensors":[{"dtype":["float32"],"shape":[]}]}'), "malformed"),  # unhashable: no TypeError
    (wire.MAGIC + _body(b'{"tensors":[{"dtype":{"a":1},"shape":[1]}]}'), "malformed"),
    (wire.MAGIC + _body(b'{"tensors":[{"dtype":"uint8","shape":[-1]}]}'), "bad tensor shape"),
    (wire.MAGIC + _body(b'{"op":"load","tensors":[]}'), "exactly one buffer"),
])
def test_limits_and_malformed_headers(raw: bytes, needle: str) -> None:
    a, b = socket.socketpair()
    a.sendall(raw)
    with pytest.raises(ProtocolError, match=needle):
        wire.recv_frame(b, wire.Limits(max_header_bytes=1024, max_tensor_bytes=1 << 20))
    a.close()
    b.close()


@pytest.mark.parametrize("bad", [{"$t": 5}, {"$f": "1e999"}, {"$map": [[1]]}, {"$zzz": 1}, [[[[[]]]]] * 1])
def test_decode_refuses_malformed_values(bad: object) -> None:
    if bad == [[[[[]]]]]:
        deep: object = []
        for _ in range(wire.MAX_DEPTH + 2):
            deep = [deep]
        bad = deep
    with pytest.raises(ProtocolError):
        wire.decode(bad, [])
