"""What a CUDA graph cannot hold, found by watching a step's ops run (the first warm-up step of
:mod:`~csrun.emulator.engine.cuda_graph`).

A captured graph replays kernels: nothing in it may need the host while it runs, and nothing it
reads or writes may move. :func:`graph_blocker` runs a step under a ``TorchDispatchMode`` that
sees every aten op (the backward's too: autograd carries the mode to its threads) and names the
first one that breaks this: an op that reads a tensor's value back to the host (tagged
``data_dependent_output``: ``.item()``, ``bool(t)``), one whose output shape depends on the data
(tagged ``dynamic_output_shape``, unless the call is static: an integer gather,
``repeat_interleave`` with its ``output_size``), a write through a boolean mask, and an op with
a tensor on another device (a copy to or from the CPU, a write to CPU state; a CPU scalar that
is only read is a kernel argument and fine). A higher-order op runs as it is: the capture itself
judges what it launches, as it does for an op that synchronizes inside its kernel.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


class _Watch(TorchDispatchMode):
    """Notes the first op of a run that a CUDA graph cannot replay (see :func:`graph_blocker`)."""

    supports_higher_order_operators = True  # run as they are: the capture itself judges what they launch

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.reason: str | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.reason is None and not isinstance(func, torch._ops.HigherOrderOperator):
            self.reason = _blocking(func, args, kwargs, out, self.device)
        return out


_aten = torch.ops.aten
_COPIES = frozenset({_aten._to_copy, _aten.copy_, _aten._copy_from, _aten._copy_from_and_resize, _aten.to})
_MASKED_WRITES = frozenset({_aten.index_put, _aten.index_put_, _aten._index_put_impl_, _aten._unsafe_index_put})


def _blocking(func: Any, args: Any, kwargs: Any, out: Any, device: torch.device) -> str | None:
    """Why ``func`` (run on ``args``, giving ``out``) cannot be in a graph on ``device``; None if it can."""
    packet = func.overloadpacket
    name = str(packet.__name__)
    tags = getattr(func, "tags", ())
    if torch.Tag.data_dependent_output in tags:
        return f"aten.{name} reads a tensor's value back to the host (.item(), bool(tensor), a comparison in Python)"
    if packet in _MASKED_WRITES and _shape_depends_on_data(func, args, kwargs):
        return f"aten.{name} writes through a boolean mask (the positions are found on the host)"
    if torch.Tag.dynamic_output_shape in tags and _shape_depends_on_data(func, args, kwargs):
        return f"aten.{name} makes a tensor whose shape depends on the data"
    tensors = [t for t in pytree.tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
    strict = packet in _COPIES  # a copy between devices, whatever its size
    elsewhere = [t.device for t in tensors if t.device != device and (strict or not (t.device.type == "cpu" and t.ndim == 0))]
    elsewhere += [t.device for t in _written(func, args, kwargs) if t.device != device]  # CPU state it changes
    if elsewhere:
        return f"aten.{name} runs with a tensor on {elsewhere[0]}, not on the device {device}"
    return None


def _written(func: Any, args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensors ``func`` writes in place (its schema's mutable arguments)."""
    written = []
    for i, arg in enumerate(func._schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.Tensor):
            written.append(value)
    return written


def _shape_depends_on_data(func: Any, args: Any, kwargs: Any) -> bool:
    """Of the ops whose output shape may depend on the data, whether this call's does: indexing
    with integer tensors (a gather, or a scatter with ``index_put``) and ``repeat_interleave``
    given its ``output_size`` do not; a boolean mask does."""
    packet = func.overloadpacket
    if packet is _aten.index or packet in _MASKED_WRITES:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)
    if packet is _aten.repeat_interleave:
        return kwargs.get("output_size") is None
    return True


def graph_blocker(run: Callable[[], Any], device: torch.device) -> tuple[Any, str | None]:
    """Call ``run`` and watch its ops (autograd's backward included); returns what it returned and
    why its ops cannot be captured in a CUDA graph on ``device`` (the first such op), or None.

    The ops run as they would without the watch: the values are the same."""
    watch = _Watch(device)
    with watch:
        result = run()
    return result, watch.reason
