"""Small pickle-free messages: JSON values, tensors and numpy arrays in dicts, tuples and lists.

:func:`pack` writes an 8-byte little-endian length of a JSON header, the header, then each
tensor's and array's raw bytes; :func:`unpack` reads them back as data (never pickle).
``mesh_reduce`` sends its values this way.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import torch

from csrun.stream.errors import BatchError
from csrun.stream.schema import dtype_name, torch_dtype


def pack(obj: Any) -> bytes:
    """Bytes for ``obj``: JSON values, tensors and numpy arrays in dicts (string keys), tuples and lists.

    Layout: 8-byte little-endian length of a JSON header, the header, then raw tensor bytes.
    """
    blobs: list[bytes] = []
    tree = _pack_node(obj, blobs)
    header = json.dumps(tree, separators=(",", ":")).encode()
    return struct.pack("<q", len(header)) + header + b"".join(blobs)


def _pack_node(node: Any, blobs: list[bytes]) -> Any:
    """The header tree of ``node``, its tensors' and arrays' bytes appended to ``blobs``."""
    if isinstance(node, torch.Tensor):
        t = node.detach().cpu().contiguous()
        blobs.append(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        return {"t": [dtype_name(t.dtype), list(t.shape)]}
    if isinstance(node, np.ndarray):
        a = np.ascontiguousarray(node)
        blobs.append(a.tobytes())
        return {"a": [a.dtype.str, list(a.shape)]}
    if isinstance(node, np.generic):
        return {"v": node.item()}
    if isinstance(node, dict):
        if not all(isinstance(k, str) for k in node):
            raise BatchError("only dicts with string keys can be packed")
        return {"d": [[k, _pack_node(v, blobs)] for k, v in node.items()]}
    if isinstance(node, tuple):
        return {"u": [_pack_node(v, blobs) for v in node]}
    if isinstance(node, list):
        return {"l": [_pack_node(v, blobs) for v in node]}
    if node is None or isinstance(node, (bool, int, float, str)):
        return {"v": node}
    raise BatchError(f"cannot pack a {type(node).__name__}: only numbers, strings, tensors and "
                     "numpy arrays in dicts, tuples and lists")


def unpack(data: bytes) -> Any:
    """The object :func:`pack` encoded."""
    view = memoryview(data)
    (hlen,) = struct.unpack("<q", view[:8])
    tree = json.loads(bytes(view[8:8 + hlen]).decode())
    return _Unpacker(view, 8 + hlen).build(tree)


class _Unpacker:
    """Walks :func:`pack`'s header tree, taking each leaf's bytes from ``view`` in order
    (an object, not a recursive closure, so no reference cycle outlives a call)."""

    def __init__(self, view: memoryview, offset: int) -> None:
        self.view = view
        self.offset = offset

    def _take(self, n: int) -> memoryview:
        part = self.view[self.offset:self.offset + n]
        self.offset += n
        return part

    def build(self, node: Any) -> Any:
        """The object ``node`` describes."""
        (kind, value), = node.items()
        if kind == "t":
            dtype, shape = torch_dtype(value[0]), tuple(value[1])
            n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            raw = torch.frombuffer(bytearray(self._take(n)), dtype=torch.uint8) if n else \
                torch.empty(0, dtype=torch.uint8)
            return raw.view(dtype).reshape(shape)
        if kind == "a":
            np_dtype, shape = np.dtype(value[0]), tuple(value[1])
            n = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
            return np.frombuffer(bytes(self._take(n)), dtype=np_dtype).reshape(shape).copy()
        if kind == "d":
            return {k: self.build(v) for k, v in value}
        if kind == "u":
            return tuple(self.build(v) for v in value)
        if kind == "l":
            return [self.build(v) for v in value]
        return value
