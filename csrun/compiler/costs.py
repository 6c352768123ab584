"""Per-layer costs of a captured step: FLOPs, weight, optimizer-state and activation bytes.

A *layer* is the innermost module of a graph node's ``nn_module_stack`` (module path such as
``encoder.layers.0.linear1``); ops outside any submodule belong to ``<model>``. Layers are
listed in the order the forward first reaches them, which is the pipeline order.

FLOPs (forward, whole batch): matmul-like ops count 2·M·N·K (linear, mm, addmm, matmul,
bmm, baddbmm, einsum-free), convolutions 2·out·(Cin/groups)·kernel, scaled-dot-product
attention 4·B·H·L·S·E plus softmax; elementwise and reductions one FLOP per output element;
views, reshapes and metadata ops nothing. Training work is 3× the forward (forward, and a
backward about twice as costly). All numbers are estimates for placement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from csrun.compiler.optim import state_slots
from csrun.compiler.spec import ProgramSpec

ROOT_LAYER = "<model>"

_FREE_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "unsqueeze", "squeeze",
    "slice", "select", "alias", "detach", "getitem", "contiguous", "flatten", "unflatten", "split",
    "split_with_sizes", "chunk", "unbind", "_assert_tensor_metadata", "sym_size", "sym_numel",
    "lift_fresh_copy", "as_strided", "expand_as", "view_as", "clone", "_to_copy", "to", "type_as",
    "empty", "empty_like", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "arange",
    "scalar_tensor", "dropout", "native_dropout", "embedding",
})
"""Ops that move or relabel data but do no arithmetic (dropout and embedding lookups are
counted as data movement only)."""

_VIEW_OPS = frozenset({"view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "unsqueeze",
                       "squeeze", "slice", "select", "alias", "detach", "getitem", "flatten", "unflatten",
                       "split", "split_with_sizes", "chunk", "unbind", "_assert_tensor_metadata", "sym_size",
                       "as_strided", "expand_as", "view_as", "contiguous"})
"""Ops whose output aliases an input: no new activation memory."""


@dataclass(kw_only=True)
class LayerCost:
    """One layer's work and memory (per sample unless named otherwise)."""

    name: str
    """Module path (``<model>`` for top-level ops)."""
    module_type: str
    """Class of the module, e.g. ``torch.nn.modules.linear.Linear``."""
    forward_flops: float = 0.0
    """Forward FLOP per sample."""
    params: int = 0
    """Parameter elements owned by the layer (first use; a tied weight counts once)."""
    weight_bytes: int = 0
    """Parameter + buffer bytes (float32 master weights)."""
    activation_bytes: float = 0.0
    """Bytes of activations one sample leaves in this layer (at the compute dtype)."""
    ops: int = 0
    """Graph nodes in this layer."""

    @property
    def train_flops(self) -> float:
        """Forward + backward FLOP per sample (3× the forward)."""
        return 3.0 * self.forward_flops


def _numel(v: Any) -> int:
    if isinstance(v, torch.Tensor):
        return int(v.numel())
    if isinstance(v, (tuple, list)):
        return sum(_numel(x) for x in v)
    return 0


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in v.shape) if isinstance(v, torch.Tensor) else ()


def _arg_val(a: Any) -> Any:
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else a


def op_name(node: torch.fx.Node) -> str:
    """The aten op's short name (``linear`` for ``aten.linear.default``), or the target's name."""
    t = node.target
    name = getattr(t, "__name__", str(t))
    if hasattr(t, "_opname"):
        return t._opname  # type: ignore[union-attr]
    return name.split(".")[0]


def node_flops(node: torch.fx.Node) -> float:
    """Estimated forward FLOP of one graph node (whole batch)."""
    name = op_name(node)
    out = node.meta.get("val")
    out_n = _numel(out)
    args = [_arg_val(a) for a in node.args]
    if name in ("linear",):
        w = _shape(args[1])
        k = w[-1] if w else 1
        return 2.0 * out_n * k + (out_n if len(args) > 2 and args[2] is not None else 0)
    if name in ("mm", "matmul", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "_addmm_activation"):
        a = _shape(args[1] if name in ("addmm", "baddbmm", "addbmm", "addmv", "_addmm_activation") else args[0])
        k = a[-1] if a else 1
        return 2.0 * out_n * k + (out_n if name.startswith("add") or name.startswith("badd") else 0)
    if name in ("conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d", "conv_transpose2d"):
        w = _shape(args[1])
        per_out = math.prod(w[1:]) if len(w) > 1 else 1
        if name.startswith("conv_transpose"):
            x = _shape(args[0])
            return 2.0 * _numel(args[0]) * (w[1] * math.prod(w[2:]) if len(w) > 2 else 1) if x else 0.0
        return 2.0 * out_n * per_out + (out_n if len(args) > 2 and args[2] is not None else 0)
    if name in ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention"):
        qs, ks = _shape(args[0]), _shape(args[1])
        vs = _shape(args[2]) if len(args) > 2 else ks
        if len(qs) < 2 or len(ks) < 2:
            return float(out_n)
        lead = math.prod(qs[:-2])
        L, E, S, Ev = qs[-2], qs[-1], ks[-2], vs[-1] if vs else qs[-1]
        return 2.0 * lead * L * S * E + 2.0 * lead * L * S * Ev + 5.0 * lead * L * S
    if name in _FREE_OPS:
        return 0.0
    if name in ("softmax", "_softmax", "log_softmax", "_log_softmax"):
        return 5.0 * out_n
    if name in ("layer_norm", "native_layer_norm", "batch_norm", "native_batch_norm", "group_norm", "_native_batch_norm_legit_functional", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training"):
        return 8.0 * _numel(args[0])
    if name in ("cross_entropy_loss", "nll_loss_forward", "nll_loss", "mse_loss", "cross_entropy"):
        return 4.0 * _numel(args[0])
    if name in ("sum", "mean", "amax", "max", "min", "var", "std", "norm", "linalg_vector_norm", "prod"):
        return float(_numel(args[0])) if args else float(out_n)
    return float(out_n)


def _layer_of(node: torch.fx.Node) -> tuple[str, str]:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ROOT_LAYER, ""
    path, typ = list(stack.values())[-1]
    if not path:
        return ROOT_LAYER, typ if isinstance(typ, str) else getattr(typ, "__qualname__", "")
    return str(path), typ if isinstance(typ, str) else f"{typ.__module__}.{typ.__qualname__}"


def layer_costs(program: torch.export.ExportedProgram, spec: ProgramSpec) -> list[LayerCost]:
    """Per-layer costs of a program, in pipeline order (see the module docstring)."""
    batch = spec.inputs[0].shape[0] if spec.inputs and spec.inputs[0].shape else 1
    batch = max(int(batch), 1)
    act_bytes = 4 if spec.precision == "float32" else 2
    sig = program.graph_signature
    param_of = dict(sig.inputs_to_parameters)
    buffer_of = dict(sig.inputs_to_buffers)
    state = program.state_dict
    constants = getattr(program, "constants", {}) or {}
    layers: dict[str, LayerCost] = {}

    def layer(name: str, typ: str) -> LayerCost:
        if name not in layers:
            layers[name] = LayerCost(name=name, module_type=typ)
        return layers[name]

    placeholders: dict[str, torch.fx.Node] = {}
    order: dict[torch.fx.Node, int] = {}
    for i, node in enumerate(program.graph.nodes):
        order[node] = i
        if node.op == "placeholder":
            placeholders[node.name] = node
            continue
        if node.op != "call_function":
            continue
        name, typ = _layer_of(node)
        lc = layer(name, typ)
        lc.ops += 1
        lc.forward_flops += node_flops(node) / batch
        if op_name(node) not in _VIEW_OPS:
            lc.activation_bytes += _numel(node.meta.get("val")) * act_bytes / batch
    # Weights belong to the layer of their first user. A tied weight (one tensor under several
    # names: torch.export gives each name its own placeholder) is counted once, at the first
    # user of any of its names.
    tied: dict[int, tuple[torch.Tensor, bool, list[torch.fx.Node]]] = {}
    for ph_name, node in placeholders.items():
        fqn = param_of.get(ph_name) or buffer_of.get(ph_name)
        if fqn is None:
            continue
        tensor = state.get(fqn, constants.get(fqn))
        if tensor is None:
            continue
        _, is_param, users = tied.setdefault(id(tensor), (tensor, ph_name in param_of, []))
        users.extend(node.users)
    for tensor, is_param, users in tied.values():
        first = min(users, key=order.__getitem__) if users else None
        lc = layer(*(_layer_of(first) if first is not None else (ROOT_LAYER, "")))
        lc.weight_bytes += tensor.numel() * tensor.element_size()
        if is_param:
            lc.params += tensor.numel()
    return list(layers.values())


def optimizer_state_bytes(layer_cost: LayerCost, spec: ProgramSpec) -> float:
    """Optimizer state for a layer's parameters (float32 slots; see :func:`state_slots`)."""
    return layer_cost.params * 4 * state_slots(spec.optimizer) if spec.mode == "train" else 0.0


def gradient_bytes(layer_cost: LayerCost, spec: ProgramSpec) -> float:
    """Float32 gradient buffer for a layer's parameters (train only)."""
    return layer_cost.params * 4.0 if spec.mode == "train" else 0.0
