"""float16 / bfloat16 compute emulated on float32 kernels, rounded where a 16-bit datapath rounds.

``torch.autocast`` on a CPU runs the 16-bit ops on 16-bit kernels, which are much slower than
float32 ones there (BENCHMARKS.md). The system's datapath multiplies 16-bit values and accumulates in float32;
the product of two float16 (or bfloat16) values is exact in float32, so the same numbers come
out of float32 kernels when the values are rounded where the datapath rounds:

- **operands**: every floating value that autocast would cast down for an op (inputs, weights
  as they are read, float32 activations entering a matmul) is rounded to the 16-bit format;
- **outputs**: every value such an op produces is rounded to the 16-bit format (overflow gives
  ``inf`` as it does in float16), so later ops see what they would have seen under autocast;
- **the op itself** computes in float32 (a float32-accumulating datapath), which differs from
  autocast only in summation order;
- **gradients**: the rounding's backward rounds the gradient to the 16-bit format, as the
  gradient of a 16-bit value is a 16-bit value under autocast; so a float16 gradient overflows
  to ``inf`` at the same magnitudes, and loss scaling behaves as it does under autocast.

Which op runs low, and which values autocast casts, is not guessed from a list: the program's
graph is run once under ``torch.autocast`` and each node's dtype is read off, on fake tensors, or
for a small program on a CPU on real zero tensors, which is cheaper (no data read, no state touched
either way: :func:`autocast_dtypes`). Ops that only move or select values (views, ``relu``, ``cat``, ...)
produce exact 16-bit values from 16-bit inputs and get no output rounding.

:func:`half_emulation_mode` reads ``CSRUN_HALF_EMULATION``: ``rounding`` (this module, the
default on CPU) or ``autocast`` (16-bit kernels, the default on CUDA, where they are fast).
"""

from __future__ import annotations

import operator
import warnings
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node
from torch.utils import _pytree as pytree

from csrun.env_settings import env_name, env_settings

ENV = env_name("half_emulation")

_aten = torch.ops.aten
EXACT_OPS = frozenset({
    _aten.view, _aten._unsafe_view, _aten.reshape, _aten.t, _aten.transpose, _aten.permute, _aten.expand,
    _aten.squeeze, _aten.unsqueeze, _aten.unflatten, _aten.flatten, _aten.clone, _aten.contiguous,
    _aten.detach, _aten.alias, _aten.slice, _aten.select, _aten.narrow, _aten.index_select, _aten.gather,
    _aten.cat, _aten.stack, _aten.split, _aten.split_with_sizes, _aten.chunk, _aten.unbind, _aten.relu,
    _aten.neg, _aten.abs, _aten.max_pool2d, _aten.max_pool2d_with_indices, _aten.repeat, _aten.embedding,
})
"""Op packets whose outputs are exact 16-bit values when their floating inputs are."""


def half_emulation_mode(device: torch.device) -> str:
    """``CSRUN_HALF_EMULATION`` if set (``rounding`` or ``autocast``), else the device's default."""
    return env_settings().half_emulation or ("rounding" if device.type == "cpu" else "autocast")


def round_half(x: Any, dtype: torch.dtype) -> Any:
    """Round a float32 tensor to ``dtype`` (float16 / bfloat16), returned as float32; anything else passes.

    Two casts, whose autograd is the rounding of the gradient: the backward of ``.to(float32)``
    casts the gradient down to ``dtype``, that of ``.to(dtype)`` casts it back up.
    """
    if isinstance(x, torch.Tensor) and x.dtype == torch.float32:
        return x.to(dtype).to(torch.float32)
    return x


REAL_PROBE_MAX_ELEMENTS = 1 << 18
"""The most elements (weights, inputs and every op's output together) a program may have for
:func:`autocast_dtypes` to run it on real zero tensors instead of fake ones: ~1 MB of float32,
whose ops on torch's 16-bit CPU kernels take at most about what the fake-tensor run does."""


class _DtypeProbe(Interpreter):
    """Runs a graph and keeps the dtype of every tensor a node produces; ``zero_state``: it reads
    a zero tensor of the same shape and dtype in place of each tensor attribute (weights, buffers,
    constants), so that the module's own state is neither read nor written."""

    def __init__(self, module: GraphModule, *, zero_state: bool = False) -> None:
        super().__init__(module)
        self.dtypes: dict[Node, torch.dtype] = {}
        self._zero_state = zero_state
        self._zeros: dict[int, torch.Tensor] = {}  # by the attribute's identity: tied weights stay one

    def run_node(self, n: Node) -> Any:  # noqa: D102
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            self.dtypes[n] = result.dtype
        return result

    def fetch_attr(self, target: str) -> Any:  # noqa: D102
        value = super().fetch_attr(target)
        if not (self._zero_state and isinstance(value, torch.Tensor)):
            return value
        if id(value) not in self._zeros:
            self._zeros[id(value)] = torch.zeros_like(value, requires_grad=False)
        return self._zeros[id(value)]


def _elements(module: GraphModule) -> int | None:
    """The elements of every value the graph holds (its attributes' tensors and each node's
    captured output); None when a node's output is not known, or when a node calls anything but
    a torch operator (aten, prims) or ``getitem``: a custom op may do more than compute."""
    total = 0
    for node in module.graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem and not (
                isinstance(node.target, torch._ops.OpOverload) and node.target.namespace in ("aten", "prims")):
            return None
        if node.op == "get_attr":
            value = _attr(module, str(node.target))
            total += value.numel() if isinstance(value, torch.Tensor) else 0
        elif node.op in ("placeholder", "call_function"):
            if "val" not in node.meta:
                return None
            for leaf in pytree.tree_leaves(node.meta["val"]):
                if isinstance(leaf, torch.Tensor):
                    total += leaf.numel()
    return total


def _inputs(module: GraphModule, make: Any) -> list[Any]:
    """The placeholders' values: ``make(shape, dtype)`` for each captured tensor, the rest as captured."""
    out = []
    for n in module.graph.nodes:
        if n.op == "placeholder":
            val = n.meta.get("val")
            out.append(make(tuple(int(d) for d in val.shape), val.dtype) if isinstance(val, torch.Tensor) else val)
    return out


def autocast_dtypes(module: GraphModule, dtype: torch.dtype, device_type: str = "cpu") -> dict[Node, torch.dtype]:
    """Each node's output dtype when ``module`` runs under ``torch.autocast(dtype)``, found without
    reading the data or changing any state.

    A program of at most :data:`REAL_PROBE_MAX_ELEMENTS` elements on a CPU that calls torch's own
    operators only (aten, prims) runs once on real zero tensors (its inputs, and in place of its
    weights and buffers), under ``no_grad`` and with the random generator's state put back: for a
    small program that is much cheaper than the general way, torch's fake-tensor dispatch (paid
    by every job: BENCHMARKS.md, the README's main job); should an op refuse zeros, the general way answers. Every
    other program runs on fake tensors shaped like the placeholders' captured values.
    """
    elements = _elements(module) if device_type == "cpu" else None
    if elements is not None and elements <= REAL_PROBE_MAX_ELEMENTS:
        probe = _DtypeProbe(module, zero_state=True)
        rng = torch.random.get_rng_state()
        try:
            with warnings.catch_warnings(), torch.no_grad(), torch.autocast(device_type, dtype=dtype):
                warnings.simplefilter("ignore")
                probe.run(*_inputs(module, lambda shape, dt: torch.zeros(shape, dtype=dt)))
            return probe.dtypes
        except Exception:  # noqa: BLE001 - an op that refuses zeros (a singular matrix, ...): fake tensors
            pass
        finally:
            torch.random.set_rng_state(rng)
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    probe = _DtypeProbe(module)
    with mode, torch.autocast(device_type, dtype=dtype):
        probe.run(*_inputs(module, lambda shape, dt: torch.empty(shape, dtype=dt)))
    return probe.dtypes


def _packet(node: Node) -> Any:
    return getattr(node.target, "overloadpacket", node.target)


def _exact(node: Node) -> bool:
    """Does ``node`` produce exact 16-bit values from 16-bit inputs?"""
    if node.target is operator.getitem:
        source = node.args[0]
        return isinstance(source, Node) and _packet(source) in EXACT_OPS
    return _packet(node) in EXACT_OPS


def _attr(module: torch.nn.Module, target: str) -> Any:
    owner: Any = module
    for part in target.split("."):
        owner = getattr(owner, part)
    return owner


class HalfWeights:
    """The 16-bit copies of the weights a program's 16-bit ops read, rounded once per step.

    Rounding each weight inside the graph costs two casts forward and two backward per weight;
    for a small model that is most of the emulation's cost. Here all of them are rounded in
    two ``_foreach_copy_`` calls before the forward (:meth:`refresh`, float32 master → 16-bit →
    float32 leaf the graph reads), and after the backward each leaf's gradient is rounded to the
    16-bit format and added to its master's (:meth:`gradients_to_masters`): what autocast does
    when it casts a weight down and its gradient back up.
    """

    PREFIX = "_csrun_half_weight_"

    def __init__(self, module: GraphModule, dtype: torch.dtype, targets: list[str]) -> None:
        """``targets``: the weights' attribute paths in ``module``, in the order of the leaves' names."""
        self.module = module
        self.dtype = dtype
        self.targets = targets
        self.masters: list[torch.Tensor] = []
        self.leaves: list[torch.Tensor] = []
        self._low: list[torch.Tensor] = []
        self.bind()

    def bind(self) -> None:
        """(Re)create the leaves for the module's current weight tensors (call after they are replaced)."""
        self.masters = [_attr(self.module, t) for t in self.targets]
        self.leaves = [torch.zeros_like(m, dtype=torch.float32, requires_grad=m.requires_grad) for m in self.masters]
        self._low = [torch.empty_like(m, dtype=self.dtype) for m in self.masters]
        for i, leaf in enumerate(self.leaves):
            setattr(self.module, f"{self.PREFIX}{i}", leaf)

    def refresh(self) -> None:
        """Round the masters' current values into the leaves."""
        if self.masters:
            with torch.no_grad():
                torch._foreach_copy_(self._low, self.masters)
                torch._foreach_copy_(self.leaves, self._low)

    def low_buffers(self) -> list[torch.Tensor]:
        """The weights' 16-bit buffers, one per master (free between :meth:`refresh` and the next step's)."""
        return self._low

    def gradients_to_masters(self) -> None:
        """Round each leaf's gradient to the 16-bit format and add it to its master's gradient."""
        pairs = [(leaf, m, low) for leaf, m, low in zip(self.leaves, self.masters, self._low) if leaf.grad is not None]
        if not pairs:
            return
        grads = [leaf.grad for leaf, _, _ in pairs if leaf.grad is not None]  # all of them: pairs has only these
        low = [buffer for _, _, buffer in pairs]  # the weights' 16-bit buffers are free until the next refresh
        with torch.no_grad():
            torch._foreach_copy_(low, grads)
            torch._foreach_copy_(grads, low)
        for (leaf, master, _), grad in zip(pairs, grads):
            if master.grad is None:
                master.grad = grad
            else:
                master.grad.add_(grad)
            leaf.grad = None


def apply_half_emulation(module: GraphModule, dtype: torch.dtype,
                         dtypes: dict[Node, torch.dtype] | None = None) -> HalfWeights:
    """Rewrite ``module`` in place so that it computes ``dtype`` on float32 kernels (see the module
    docstring). The module then runs without autocast; call the returned :class:`HalfWeights`'
    ``refresh`` before each forward and ``gradients_to_masters`` after each backward.
    ``dtypes`` is :func:`autocast_dtypes`' answer if already known."""
    low = dtypes if dtypes is not None else autocast_dtypes(module, dtype)
    graph = module.graph
    rounded: dict[Node, Node] = {}  # a value's one rounded copy (operands shared by several ops)
    inserted: set[Node] = set()
    weights: list[str] = []

    def is_low(n: Node) -> bool:
        return n in inserted or low.get(n) == dtype

    def rounding_of(n: Node) -> Node:
        if n not in rounded:
            value = _attr(module, str(n.target)) if n.op == "get_attr" else None
            if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
                name = f"{HalfWeights.PREFIX}{len(weights)}"
                setattr(module, name, torch.zeros(()))
                weights.append(str(n.target))
                with graph.inserting_after(n), warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # a plain tensor attribute, on purpose
                    r = graph.get_attr(name)
            else:
                with graph.inserting_after(n):
                    r = graph.call_function(round_half, (n, dtype))
            r.meta = dict(n.meta)
            rounded[n] = r
            inserted.add(r)
        return rounded[n]

    for node in list(graph.nodes):
        if node.op != "call_function" or node in inserted or not is_low(node):
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype != torch.float32:
            continue  # already 16-bit in the program itself (an explicit .half())
        for inp in list(node.all_input_nodes):
            if is_low(inp) or low.get(inp) != torch.float32:
                continue  # already 16-bit, or not a floating value autocast would cast
            node.replace_input_with(inp, rounding_of(inp))
        if not _exact(node) and node.users and isinstance(val, torch.Tensor):
            users = list(node.users)
            r = rounding_of(node)
            for u in users:
                u.replace_input_with(node, r)
    for node in list(graph.nodes):  # a weight only 16-bit ops read is now read through its leaf alone
        if node.op == "get_attr" and not node.users and str(node.target) in weights:
            graph.erase_node(node)
    graph.lint()
    module.recompile()
    return HalfWeights(module, dtype, weights)
