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

Small pickle-free messages are :mod:`csrun.stream.message`'s; the check that a pipeline did not
refill a batch it handed over is :mod:`csrun.stream.refill`'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from csrun.stream.errors import BatchError

WIRE_DTYPES: dict[str, str] = {"int64": "int32"}
"""Loader dtype -> dtype on the wire, for the dtypes that change on the wire."""

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1


def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype's name as the wire writes it (``float32``)."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a wire name stands for (:class:`BatchError` for anything else)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise BatchError(f"unknown dtype {name!r} in a stream schema")
    return dtype


def show_path(path: str) -> str:
    """A leaf path as messages write it (the root is ``<batch>``)."""
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
        return self.numel * torch_dtype(self.wire_dtype).itemsize


def _infer_node(node: Any, path: str, leaves: list[Leaf]) -> Any:
    """The schema tree of ``node`` at ``path``, its tensors' leaves appended to ``leaves``."""
    if isinstance(node, torch.Tensor):
        _check_tensor(node, path)
        name = dtype_name(node.dtype)
        leaves.append(Leaf(path=path, dtype=name, wire_dtype=WIRE_DTYPES.get(name, name),
                           shape=tuple(node.shape)))
        return {"leaf": len(leaves) - 1}
    if isinstance(node, dict):
        items = []
        for key, value in node.items():
            if not isinstance(key, str):
                raise BatchError(f"batch dict key {key!r} at {show_path(path)} is a "
                                 f"{type(key).__name__}; only string keys can be streamed")
            items.append([key, _infer_node(value, f"{path}[{key!r}]", leaves)])
        return {"dict": items}
    if type(node) in (tuple, list):
        kind = "tuple" if isinstance(node, tuple) else "list"
        return {kind: [_infer_node(v, f"{path}[{i}]", leaves) for i, v in enumerate(node)]}
    raise BatchError(f"batch leaf at {show_path(path)} is a {type(node).__name__}; only torch "
                     "tensors (in dicts, tuples and lists) can be streamed")


def _flatten_node(node: Any, spec: Any, path: str, leaves: tuple[Leaf, ...], out: list[torch.Tensor]) -> None:
    """Append ``node``'s tensors to ``out`` in ``spec``'s order; :class:`BatchError` on a mismatch."""
    if "leaf" in spec:
        leaf = leaves[spec["leaf"]]
        if not isinstance(node, torch.Tensor):
            raise BatchError(f"batch leaf at {show_path(path)} is a {type(node).__name__}, "
                             "the first batch had a tensor there")
        _check_tensor(node, path)
        if dtype_name(node.dtype) != leaf.dtype or tuple(node.shape) != leaf.shape:
            raise BatchError(
                f"batch tensor at {show_path(path)} is {dtype_name(node.dtype)}{list(node.shape)}, "
                f"the first batch had {leaf.dtype}{list(leaf.shape)}: shapes and dtypes must be "
                "static (set drop_last=True and pad to a fixed length)")
        out.append(node)
    elif "dict" in spec:
        keys = [k for k, _ in spec["dict"]]
        if not isinstance(node, dict) or list(node.keys()) != keys:
            got = list(node.keys()) if isinstance(node, dict) else type(node).__name__
            raise BatchError(f"batch at {show_path(path)} is {got}, the first batch had keys {keys}")
        for key, sub in spec["dict"]:
            _flatten_node(node[key], sub, f"{path}[{key!r}]", leaves, out)
    else:
        kind = "tuple" if "tuple" in spec else "list"
        items = spec[kind]
        want = tuple if kind == "tuple" else list
        if type(node) is not want or len(node) != len(items):
            raise BatchError(f"batch at {show_path(path)} is a {type(node).__name__} of "
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
            return [torch.empty(leaf.shape, dtype=torch_dtype(leaf.dtype)) for leaf in self.leaves]

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
            t = buf.view(torch_dtype(leaf.wire_dtype)).reshape(leaf.shape)
            if leaf.wire_dtype != leaf.dtype:
                t = t.to(torch_dtype(leaf.dtype))
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
                torch_dtype(leaf.dtype), torch_dtype(leaf.wire_dtype)
            schema = cls(tree=doc["tree"], leaves=leaves)
            _check_tree(schema.tree, len(leaves))
        except (ValueError, KeyError, TypeError) as exc:
            raise BatchError(f"malformed stream schema: {exc}") from None
        return schema

    def describe(self) -> str:
        """One line per leaf: path, dtype, shape (for messages)."""
        return "; ".join(f"{show_path(l.path)}: {l.dtype}{list(l.shape)}" for l in self.leaves)


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
        raise BatchError(f"batch tensor at {show_path(path)} is on {t.device}; the input pipeline "
                         "must produce CPU tensors")
    if t.is_sparse or t.layout != torch.strided:
        raise BatchError(f"batch tensor at {show_path(path)} has layout {t.layout}; only dense tensors stream")


def _narrow(t: torch.Tensor, leaf: Leaf) -> torch.Tensor:
    _check_narrow(t, leaf)
    return t.to(torch_dtype(leaf.wire_dtype))


def _check_narrow(t: torch.Tensor, leaf: Leaf) -> None:
    """:class:`BatchError` unless every value of the int64 ``t`` fits the wire's int32."""
    if t.numel():
        lo, hi = int(t.min()), int(t.max())
        if lo < _INT32_MIN or hi > _INT32_MAX:
            bad = hi if hi > _INT32_MAX else lo
            raise BatchError(
                f"int64 tensor at {show_path(leaf.path)} holds {bad}, which does not fit int32: integer "
                f"inputs stream as int32 (range {_INT32_MIN}..{_INT32_MAX}); remap the values or "
                "use a float dtype")


def _bytes_view(t: torch.Tensor) -> np.ndarray:
    t = t.detach().resolve_conj().resolve_neg().contiguous()  # a lazy conjugate or negation: its values
    return t.reshape(-1).view(torch.uint8).numpy()
