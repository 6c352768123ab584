"""The emulator's wire format: length-prefixed frames of a JSON header plus raw tensor buffers.

Frame layout (all integers big-endian)::

    b"CSE1"  magic (the frame layout's)   4 bytes
    H        header length                4 bytes, <= Limits.max_header_bytes
    header   UTF-8 JSON object            H bytes
    buffers  raw tensor bytes, back to back, in the order of header["tensors"]

``header["tensors"]`` lists ``{"dtype": name, "shape": [..]}``; each buffer's length is computed
from dtype and shape (never trusted from the sender) and checked against the limits before
anything is read; an empty tensor (0 bytes) whose strides torch cannot hold (the product of its
other dimensions beyond 64 bits: ``[0, 2^40-1, 2^40-1]``) is refused too. Buffers become tensors with ``torch.frombuffer``; nothing is ever unpickled.

Structured values (a batch, a state dict) travel as JSON with tensors replaced by
``{"$t": index}``; tuples as ``{"$tuple": [...]}``; mappings with non-string keys as
``{"$map": [[key, value], ...]}`` (:func:`encode` / :func:`decode`).

The session protocol's version (:data:`PROTOCOL_VERSION`) travels in the hello
(:mod:`csrun.emulator.remote.handshake`); version 2 replaced the token in the hello with a
challenge-response and added ``ping`` keep-alives.
"""

from __future__ import annotations

import json
import math
import socket
import struct
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from csrun.emulator.remote.errors import ProtocolError

MAGIC = b"CSE1"
PROTOCOL_VERSION = 2
"""Version carried in the hello; each side refuses a peer speaking another, naming both versions."""
_PREFIX = struct.Struct(">4sI")

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "uint8": torch.uint8, "bool": torch.bool, "complex64": torch.complex64,
}
"""The tensor dtypes the wire carries."""
_NAMES = {v: k for k, v in DTYPES.items()}
_STRIDE_LIMIT = 2**63 - 1
"""The largest product of a shape's dimensions (zeros taken as ones) whose strides torch can hold."""
MAX_DEPTH = 32
"""Deepest nesting of a structured value."""


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Size limits on every field of a frame; a frame over any of them closes the connection."""

    max_header_bytes: int = 1 << 20
    """JSON header size (default 1 MiB)."""
    max_tensors: int = 4096
    """Tensors in one frame."""
    max_tensor_bytes: int = 1 << 30
    """One tensor's buffer (default 1 GiB)."""
    max_frame_bytes: int = 4 << 30
    """All buffers of one frame together (default 4 GiB)."""
    max_program_bytes: int = 2 << 30
    """A program archive upload (default 2 GiB)."""
    max_dims: int = 16
    """Dimensions of one tensor."""


class Link(Protocol):
    """What frames travel over: a socket, a TLS socket, or a wrapper around one."""

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        """Receive up to ``nbytes`` into ``buffer``; 0 at the end of the stream."""

    def sendall(self, data: Any) -> None:
        """Send all of ``data``."""


def _recv_exact(sock: Link, n: int) -> bytearray:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return buf


def _recv_into(sock: Link, view: memoryview) -> None:
    n = len(view)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("connection closed")
        got += k


SOCKET_BUFFER_BYTES = 8 << 20
"""Send/receive buffer size asked for on link sockets (large batches in fewer wakeups)."""


def tune_socket(sock: socket.socket) -> None:
    """Low latency and large buffers for a link socket."""
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        except OSError:
            pass
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


def _tensor_meta(t: torch.Tensor) -> dict[str, Any]:
    if t.dtype not in _NAMES:
        raise ProtocolError(f"dtype {t.dtype} cannot travel on the wire (supported: {', '.join(DTYPES)})")
    return {"dtype": _NAMES[t.dtype], "shape": list(t.shape)}


def _as_bytes(t: torch.Tensor) -> memoryview:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]  # numpy's stubs: ndarray is a buffer


def send_frame(sock: Link, header: dict[str, Any], tensors: list[torch.Tensor] | None = None) -> None:
    """Send one frame: ``header`` (JSON-able; its ``tensors`` key is filled in) and the buffers."""
    tensors = tensors or []
    header = dict(header)
    header["tensors"] = [_tensor_meta(t) for t in tensors]
    raw = json.dumps(header, separators=(",", ":")).encode()
    parts = [_PREFIX.pack(MAGIC, len(raw)), raw]
    sock.sendall(b"".join(parts))
    for t in tensors:
        b = _as_bytes(t)
        if len(b):
            sock.sendall(b)


def recv_frame(sock: Link, limits: Limits, *, max_tensor_bytes: int | None = None) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """Receive one frame, enforcing ``limits``; raises :class:`ProtocolError` or ``EOFError``.

    A ``load`` frame's single buffer is held to ``max_program_bytes`` instead of the tensor and
    frame limits. ``max_tensor_bytes`` overrides the per-tensor limit (clients use it for results).
    """
    prefix = _recv_exact(sock, _PREFIX.size)
    magic, hlen = _PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {bytes(magic)!r}")
    if hlen > limits.max_header_bytes:
        raise ProtocolError(f"header of {hlen} bytes is over the limit of {limits.max_header_bytes}")
    raw = _recv_exact(sock, hlen)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"header is not JSON ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    metas = header.get("tensors", [])
    if not isinstance(metas, list):
        raise ProtocolError("header 'tensors' is not a list")
    if len(metas) > limits.max_tensors:
        raise ProtocolError(f"{len(metas)} tensors in one frame, over the limit of {limits.max_tensors}")
    per_tensor = limits.max_tensor_bytes if max_tensor_bytes is None else max_tensor_bytes
    frame_limit = limits.max_frame_bytes
    if header.get("op") == "load":  # the program archive is one uint8 buffer with its own limit
        per_tensor = frame_limit = limits.max_program_bytes
        if len(metas) != 1:
            raise ProtocolError("a load frame carries exactly one buffer (the program archive)")
    plan: list[tuple[torch.dtype, tuple[int, ...], int]] = []
    total = 0
    for m in metas:
        if not isinstance(m, dict) or not isinstance(m.get("dtype"), str) or m["dtype"] not in DTYPES \
                or not isinstance(m.get("shape"), list):
            raise ProtocolError("malformed tensor description in header")
        shape = m["shape"]
        if len(shape) > limits.max_dims or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape):
            raise ProtocolError(f"bad tensor shape {shape!r}")
        dtype = DTYPES[m["dtype"]]
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = math.prod(shape) * itemsize
        if nbytes > per_tensor:
            raise ProtocolError(f"tensor of {nbytes} bytes is over the limit of {per_tensor}")
        if math.prod(max(d, 1) for d in shape) > _STRIDE_LIMIT:  # empty, but torch cannot hold its strides
            raise ProtocolError(f"empty tensor of shape {shape!r}: its strides do not fit in 64 bits")
        total += nbytes
        if total > frame_limit:
            raise ProtocolError(f"frame buffers total over the limit of {frame_limit} bytes")
        plan.append((dtype, tuple(shape), nbytes))
    tensors = []
    for dtype, shape, nbytes in plan:
        if nbytes == 0:
            tensors.append(torch.empty(shape, dtype=dtype))
            continue
        raw_t = torch.empty(nbytes, dtype=torch.uint8)  # not zero-filled, unlike bytearray
        _recv_into(sock, memoryview(raw_t.numpy()))  # type: ignore[arg-type]  # numpy's stubs: ndarray is a buffer
        tensors.append(raw_t.view(dtype).reshape(shape))
    return header, tensors


def encode(obj: Any, tensors: list[torch.Tensor], depth: int = 0) -> Any:
    """Turn a structured value into JSON, appending its tensors to ``tensors``."""
    if depth > MAX_DEPTH:
        raise ProtocolError("value nested too deeply for the wire")
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return {"$t": len(tensors) - 1}
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return {"$f": repr(obj)}
    if isinstance(obj, tuple):
        return {"$tuple": [encode(v, tensors, depth + 1) for v in obj]}
    if isinstance(obj, list):
        return [encode(v, tensors, depth + 1) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in obj):
            return {k: encode(v, tensors, depth + 1) for k, v in obj.items()}
        return {"$map": [[encode(k, tensors, depth + 1), encode(v, tensors, depth + 1)] for k, v in obj.items()]}
    raise ProtocolError(f"a {type(obj).__name__} cannot travel on the wire")


def decode(obj: Any, tensors: list[torch.Tensor], depth: int = 0) -> Any:
    """Inverse of :func:`encode`; raises :class:`ProtocolError` on anything malformed."""
    if depth > MAX_DEPTH:
        raise ProtocolError("value nested too deeply")
    if obj is None or isinstance(obj, (bool, int, str, float)):
        return obj
    if isinstance(obj, list):
        return [decode(v, tensors, depth + 1) for v in obj]
    if isinstance(obj, dict):
        if len(obj) == 1:
            (key, val), = obj.items()
            if key == "$t":
                if not isinstance(val, int) or isinstance(val, bool) or not 0 <= val < len(tensors):
                    raise ProtocolError("bad tensor reference")
                return tensors[val]
            if key == "$f":
                if val not in ("inf", "-inf", "nan"):
                    raise ProtocolError("bad float")
                return float(val)
            if key == "$tuple":
                if not isinstance(val, list):
                    raise ProtocolError("bad tuple")
                return tuple(decode(v, tensors, depth + 1) for v in val)
            if key == "$map":
                if not isinstance(val, list) or not all(isinstance(p, list) and len(p) == 2 for p in val):
                    raise ProtocolError("bad map")
                out = {}
                for k, v in val:
                    dk = decode(k, tensors, depth + 1)
                    if not isinstance(dk, (str, int, float, bool, type(None))):
                        raise ProtocolError("bad map key")
                    out[dk] = decode(v, tensors, depth + 1)
                return out
        if any(isinstance(k, str) and k.startswith("$") for k in obj):
            raise ProtocolError("unknown tagged value")
        return {k: decode(v, tensors, depth + 1) for k, v in obj.items()}
    raise ProtocolError("malformed value")
