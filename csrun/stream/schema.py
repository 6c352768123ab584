"""The one-time description of a stream's batches, and the raw buffers that follow it.

A batch is a nested structure of ``dict`` (string keys), ``tuple`` and ``list`` whose leaves
are CPU :class:`torch.Tensor` objects with static shapes. :meth:`Schema.infer` reads that
structure from the first batch; :meth:`Schema.to_json` turns it into JSON bytes (sent once
per stream, never pickled); every later batch travels as one raw byte buffer per leaf.

Wire dtypes: ``int64`` leaves travel as ``int32`` (the system streamed integer inputs as
int32) when every value fits; :meth:`Schema.encode` raises :class:`BatchError` naming the
value and the leaf when one does not. :meth:`Schema.decode` hands back the dtype the loader
produced (``int64``), because PyTorch losses want int64 targets. Other dtypes travel as they
are, bit for bit (bfloat16 included).

Leaf paths are written like ``['input_ids']``, ``[0]`` or ``['labels'][1]`` (the root itself
is ``<batch>``), the same spelling the compiler's ``TensorSpec.path`` uses.

:func:`pack` / :func:`unpack` reuse the same encoding for small pickle-free messages made of
JSON values, tensors and numpy arrays (``mesh_reduce`` uses them).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from csrun.stream.errors import BatchError

WIRE_DTYPES: dict[str, str] = {"int64": "int32"}
"""Loader dtype -> dtype on the wire, for the dtypes that change on the wire."""

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise BatchError(f"unknown dtype {name!r} in a stream schema")
    return dtype


def _show(path: str) -> str:
    return path or "<batch>"


@dataclass(frozen=True, kw_only=True)
class Leaf:
    """One tensor of the batch: where it sits, its dtype at the loader and on the wire, its shape."""

    path: str
    """Where the leaf sits, e.g. ``['labels'][1]``; empty for a batch that is one tensor."""
    dtype: str
    """torch dtype name the loader produced and the model receives, e.g. ``int64``."""
    wire_dtype: str
    """torch dtype name on the wire, e.g. ``int32`` for an ``int64`` leaf."""
    shape: tuple[int, ...]
    """Static shape; the first dimension is the batch size."""

    @property
    def numel(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of this leaf on the wire."""
        return self.numel * _torch_dtype(self.wire_dtype).itemsize


def _infer_node(node: Any, path: str, leaves: list[Leaf]) -> Any:
    """The schema tree of ``node`` at ``path``, its tensors' leaves appended to ``leaves``."""
    if isinstance(node, torch.Tensor):
        _check_tensor(node, path)
        name = _dtype_name(node.dtype)
        leaves.append(Leaf(path=path, dtype=name, wire_dtype=WIRE_DTYPES.get(name, name),
                           shape=tuple(node.shape)))
        return {"leaf": len(leaves) - 1}
    if isinstance(node, dict):
        items = []
        for key, value in node.items():
            if not isinstance(key, str):
                raise BatchError(f"batch dict key {key!r} at {_show(path)} is a "
                                 f"{type(key).__name__}; only string keys can be streamed")
            items.append([key, _infer_node(value, f"{path}[{key!r}]", leaves)])
        return {"dict": items}
    if type(node) in (tuple, list):
        kind = "tuple" if isinstance(node, tuple) else "list"
        return {kind: [_infer_node(v, f"{path}[{i}]", leaves) for i, v in enumerate(node)]}
    raise BatchError(f"batch leaf at {_show(path)} is a {type(node).__name__}; only torch "
                     "tensors (in dicts, tuples and lists) can be streamed")


def _flatten_node(node: Any, spec: Any, path: str, leaves: tuple[Leaf, ...], out: list[torch.Tensor]) -> None:
    """Append ``node``'s tensors to ``out`` in ``spec``'s order; :class:`BatchError` on a mismatch."""
    if "leaf" in spec:
        leaf = leaves[spec["leaf"]]
        if not isinstance(node, torch.Tensor):
            raise BatchError(f"batch leaf at {_show(path)} is a {type(node).__name__}, "
                             "the first batch had a tensor there")
        _check_tensor(node, path)
        if _dtype_name(node.dtype) != leaf.dtype or tuple(node.shape) != leaf.shape:
            raise BatchError(
                f"batch tensor at {_show(path)} is {_dtype_name(node.dtype)}{list(node.shape)}, "
                f"the first batch had {leaf.dtype}{list(leaf.shape)}: shapes and dtypes must be "
                "static (set drop_last=True and pad to a fixed length)")
        out.append(node)
    elif "dict" in spec:
        keys = [k for k, _ in spec["dict"]]
        if not isinstance(node, dict) or list(node.keys()) != keys:
            got = list(node.keys()) if isinstance(node, dict) else type(node).__name__
            raise BatchError(f"batch at {_show(path)} is {got}, the first batch had keys {keys}")
        for key, sub in spec["dict"]:
            _flatten_node(node[key], sub, f"{path}[{key!r}]", leaves, out)
    else:
        kind = "tuple" if "tuple" in spec else "list"
        items = spec[kind]
        want = tuple if kind == "tuple" else list
        if type(node) is not want or len(node) != len(items):
            raise BatchError(f"batch at {_show(path)} is a {type(node).__name__} of "
                             f"{len(node) if isinstance(node, (tuple, list)) else '?'} items, "
                             f"the first batch had a {kind} of {len(items)}")
        for i, (value, sub) in enumerate(zip(node, items)):
            _flatten_node(value, sub, f"{path}[{i}]", leaves, out)


@dataclass(frozen=True, kw_only=True)
class Schema:
    """The structure, dtypes and shapes of every batch of one stream."""

    tree: Any
    """JSON form of the structure: ``{"leaf": i}``, ``{"dict": [[key, node], ...]}``,
    ``{"tuple": [node, ...]}`` or ``{"list": [node, ...]}``."""
    leaves: tuple[Leaf, ...]
    """The tensors, in depth-first order (the order of the buffers on the wire)."""

    @property
    def nbytes(self) -> int:
        """Bytes of one batch on the wire."""
        return sum(leaf.nbytes for leaf in self.leaves)

    # -- building and checking -------------------------------------------------------------

    @classmethod
    def infer(cls, batch: Any) -> "Schema":
        """Read the schema from one batch; :class:`BatchError` for anything but tensors in dict/tuple/list."""
        leaves: list[Leaf] = []
        tree = _infer_node(batch, "", leaves)
        return cls(tree=tree, leaves=tuple(leaves))

    def flatten(self, batch: Any) -> list[torch.Tensor]:
        """The batch's tensors in schema order; :class:`BatchError` when the batch does not match."""
        out: list[torch.Tensor] = []
        _flatten_node(batch, self.tree, "", self.leaves, out)
        return out

    def unflatten(self, tensors: Sequence[torch.Tensor]) -> Any:
        """Rebuild the batch structure around ``tensors`` (schema order)."""
        return _build(self.tree, tensors)

    # -- wire form ------------------------------------------------------------------------

    def encode(self, batch: Any) -> list[np.ndarray]:
        """One contiguous ``uint8`` numpy buffer per leaf, in wire dtypes (int64 -> int32, checked)."""
        return self.encode_leaves(self.flatten(batch))

    def encode_leaves(self, tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
        """:meth:`encode` of a batch already flattened (:meth:`flatten`: checked, in schema order)."""
        buffers = []
        for leaf, tensor in zip(self.leaves, tensors):
            if leaf.wire_dtype != leaf.dtype:
                tensor = _narrow(tensor, leaf)
            buffers.append(_bytes_view(tensor))
        return buffers

    def local_buffers(self) -> list[torch.Tensor]:
        """Buffers for one batch as the loader makes it: a tensor per leaf in its own dtype and shape
        (the lone chief's copies, :meth:`copy_into`). Never inference tensors, even when the first
        batch is taken inside ``torch.inference_mode()`` (an eval pass): they are refilled outside it."""
        with torch.inference_mode(False):
            return [torch.empty(leaf.shape, dtype=_torch_dtype(leaf.dtype)) for leaf in self.leaves]

    def copy_into(self, tensors: Sequence[torch.Tensor], buffers: Sequence[torch.Tensor]) -> Any:
        """What ``decode(encode(batch))`` gives for the batch whose :meth:`flatten` is ``tensors``,
        in ``buffers`` (:meth:`local_buffers`), without the bytes in between: the same checks (the
        structure, static shapes and dtypes by ``flatten``; int64 values that fit int32 here, with
        the same messages), the same values and dtypes, and memory the caller owns, as a batch from
        the wire is (a loader may refill its tensors in place once it has handed them over). One
        copy per leaf: the round trip took two conversions more for an int64 leaf."""
        out = []
        for leaf, tensor, buf in zip(self.leaves, tensors, buffers):
            if leaf.wire_dtype != leaf.dtype:
                _check_narrow(tensor, leaf)
            buf.copy_(tensor.detach())
            out.append(buf.view(leaf.shape))  # a view: the pool sees the batch alive through it
        return self.unflatten(out)

    def sent_in_place(self, tensors: Sequence[torch.Tensor]) -> list[tuple[str, torch.Tensor, int]]:
        """``(path, tensor, version)`` of each leaf (``tensors``: the batch's :meth:`flatten`) that
        :meth:`encode` sends from the batch's own memory (contiguous, not narrowed), with its
        in-place version counter now: a sender in flight reads that memory until its send
        completes. Only tensors that are the whole of their storage: a view's counter (or that of a
        tensor detached from one) is the whole storage's, which moves with writes anywhere in it;
        inference-mode tensors have no counter."""
        return [(leaf.path, t, t._version) for leaf, t in zip(self.leaves, tensors)
                if leaf.wire_dtype == leaf.dtype and _whole_storage(t) and not t.is_inference()]

    def alloc(self) -> list[torch.Tensor]:
        """Fresh receive buffers: one flat ``uint8`` tensor per leaf, sized for the wire.

        The memory comes from numpy, which asks for transparent huge pages on large blocks;
        MPI's shared-memory copies into them run faster than into 4 KB pages.
        """
        return [torch.from_numpy(np.empty(leaf.nbytes, dtype=np.uint8)) for leaf in self.leaves]

    def decode(self, buffers: Sequence[torch.Tensor], *, copy: bool = False) -> Any:
        """The batch from wire buffers (flat uint8 tensors), in the loader's dtypes.

        Leaves whose dtype changed on the wire are converted (a new tensor); the others are
        views of ``buffers`` unless ``copy`` is set.
        """
        out = []
        for leaf, buf in zip(self.leaves, buffers):
            t = buf.view(_torch_dtype(leaf.wire_dtype)).reshape(leaf.shape)
            if leaf.wire_dtype != leaf.dtype:
                t = t.to(_torch_dtype(leaf.dtype))
            elif copy:
                t = t.clone()
            out.append(t)
        return self.unflatten(out)

    def to_json(self) -> bytes:
        """JSON bytes of the schema (what the streamer sends once)."""
        doc = {"tree": self.tree,
               "leaves": [{"path": l.path, "dtype": l.dtype, "wire_dtype": l.wire_dtype,
                           "shape": list(l.shape)} for l in self.leaves]}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "Schema":
        """The schema from :meth:`to_json` bytes; :class:`BatchError` when malformed."""
        try:
            doc = json.loads(bytes(data).decode())
            leaves = tuple(Leaf(path=str(l["path"]), dtype=str(l["dtype"]),
                                wire_dtype=str(l["wire_dtype"]),
                                shape=tuple(int(d) for d in l["shape"])) for l in doc["leaves"])
            for leaf in leaves:
                _torch_dtype(leaf.dtype), _torch_dtype(leaf.wire_dtype)
            schema = cls(tree=doc["tree"], leaves=leaves)
            _check_tree(schema.tree, len(leaves))
        except (ValueError, KeyError, TypeError) as exc:
            raise BatchError(f"malformed stream schema: {exc}") from None
        return schema

    def describe(self) -> str:
        """One line per leaf: path, dtype, shape (for messages)."""
        return "; ".join(f"{_show(l.path)}: {l.dtype}{list(l.shape)}" for l in self.leaves)


def _build(spec: Any, tensors: Sequence[torch.Tensor]) -> Any:
    # a module-level function, not a nested closure: a recursive closure is a reference
    # cycle that would keep the batch's tensors (and their receive buffers) alive until gc
    if "leaf" in spec:
        return tensors[spec["leaf"]]
    if "dict" in spec:
        return {key: _build(sub, tensors) for key, sub in spec["dict"]}
    if "tuple" in spec:
        return tuple(_build(sub, tensors) for sub in spec["tuple"])
    return [_build(sub, tensors) for sub in spec["list"]]


def _check_tree(node: Any, n: int) -> None:
    if not isinstance(node, dict) or len(node) != 1:
        raise ValueError(f"bad schema node {node!r}")
    (kind, value), = node.items()
    if kind == "leaf":
        if not isinstance(value, int) or not 0 <= value < n:
            raise ValueError(f"bad leaf index {value!r}")
    elif kind == "dict":
        for key, sub in value:
            if not isinstance(key, str):
                raise ValueError(f"bad dict key {key!r}")
            _check_tree(sub, n)
    elif kind in ("tuple", "list"):
        for sub in value:
            _check_tree(sub, n)
    else:
        raise ValueError(f"bad schema node kind {kind!r}")


def _check_tensor(t: torch.Tensor, path: str) -> None:
    if t.device.type != "cpu":
        raise BatchError(f"batch tensor at {_show(path)} is on {t.device}; the input pipeline "
                         "must produce CPU tensors")
    if t.is_sparse or t.layout != torch.strided:
        raise BatchError(f"batch tensor at {_show(path)} has layout {t.layout}; only dense tensors stream")


REFILL_WATCH = 2
"""How many of the last batches handed over a refill is checked against (a streamer has up to two
in flight; a pipeline alternating between two sets of tensors is caught at its third batch)."""


def _whole_storage(t: torch.Tensor) -> bool:
    return t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.nbytes


def check_untouched(handed: Sequence[Sequence[tuple[str, torch.Tensor, int]]]) -> None:
    """:class:`BatchError` if the input pipeline wrote (with a torch in-place op) into a tensor of a
    batch it had handed over (``handed``: :meth:`Schema.sent_in_place` of each such batch, taken when
    it was handed over): a streamer may still be sending it, and a chief's streamed batch could mix
    two. The lone chief refuses it too (it copies, but a CPU run refuses what a streamed run would)."""
    for watched in handed:
        for path, tensor, version in watched:
            if tensor._version != version:
                raise BatchError(
                    f"the input pipeline wrote into the tensor at {_show(path)} of a batch it had already "
                    "handed over (a collate_fn or dataset that refills the same tensors): csrun streams each "
                    "batch from its tensors while the next one loads; return new tensors for every batch "
                    "(torch's default_collate does)")


def _narrow(t: torch.Tensor, leaf: Leaf) -> torch.Tensor:
    _check_narrow(t, leaf)
    return t.to(_torch_dtype(leaf.wire_dtype))


def _check_narrow(t: torch.Tensor, leaf: Leaf) -> None:
    """:class:`BatchError` unless every value of the int64 ``t`` fits the wire's int32."""
    if t.numel():
        lo, hi = int(t.min()), int(t.max())
        if lo < _INT32_MIN or hi > _INT32_MAX:
            bad = hi if hi > _INT32_MAX else lo
            raise BatchError(
                f"int64 tensor at {_show(leaf.path)} holds {bad}, which does not fit int32: integer "
                f"inputs stream as int32 (range {_INT32_MIN}..{_INT32_MAX}); remap the values or "
                "use a float dtype")


def _bytes_view(t: torch.Tensor) -> np.ndarray:
    t = t.detach().resolve_conj().resolve_neg().contiguous()  # a lazy conjugate or negation: its values
    return t.reshape(-1).view(torch.uint8).numpy()


# -- small pickle-free messages ------------------------------------------------------------

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
        return {"t": [_dtype_name(t.dtype), list(t.shape)]}
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
            dtype, shape = _torch_dtype(value[0]), tuple(value[1])
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
