"""Weight-streaming placement: one layer group at a time on the whole wafer, weights in MemoryX.

In weight-streaming mode (:mod:`csrun.program.execution`) the wafer holds no model. MemoryX
(:class:`~csrun.compiler.wafer.MemoryXSpec`) keeps the float32 master weights, their 16-bit
copies (mixed precision), the optimizer state and the step's gradient sums, and runs the
optimizer update. A step runs the layer groups in order (forward) and then in reverse
(backward); each group's weights stream onto the wafer for each of the two passes, and its
gradients stream back out after its backward (seed 003).

**Layer groups.** The costs' layers (innermost modules, :mod:`csrun.compiler.costs`) are
grouped by their module path up to the first numeric part (``blocks.3.attn.qkv`` ->
``blocks.3``: one decoder block, an element of a ModuleList/Sequential); a path without one is
grouped by its first part (``wte``, ``lm_head``, ``<model>``). Groups keep the pipeline order.

**Fit rule** (what must be resident at once, in the wafer's SRAM), for the group that runs:
its weights, the next group's weights (the buffer the stream fills while this one computes),
its gradients, and the activations of every group for the samples resident at once (kept for
the backward; no recomputation). The samples resident at once are the *micro batch*: the
largest divisor of the batch size for which every group fits; the batch then runs as
``batch / micro`` passes whose gradients are summed (the system's automatic gradient
accumulation of weight-streaming mode, ``use_cs_grad_accum``). The emulator computes the
whole batch in one pass: the micro batch changes the estimate, not the numerics. It does not
fit when one sample does not fit, or when MemoryX cannot hold the model's state.

**Throughput** per step (estimate): for each group and pass, the forward takes the longer of
its compute (a third of the training FLOP, on as many PEs as the work can use, bounded as in
:mod:`csrun.compiler.placement`) and streaming its weights in; the backward the longest of its
compute (two thirds), streaming the weights in again and streaming the gradients out (the links'
two directions, :class:`~csrun.compiler.wafer.MemoryXSpec` bandwidths). Streaming overlaps the
compute of the group before (the buffer); the update in MemoryX overlaps the next step's
forward and is not counted. ``est_samples_per_sec`` = batch / step time. All of it is an
*estimate*, and the plan states the bandwidths it assumed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from csrun.compiler.costs import ROOT_LAYER, LayerCost, gradient_bytes, optimizer_state_bytes
from csrun.compiler.placement import LayerPlacement, Plan
from csrun.compiler.spec import ProgramSpec
from csrun.compiler.wafer import MemoryXSpec, WaferSpec
from csrun.program.execution import WEIGHT_STREAMING

STREAMING_WHY = ("weight streaming: weights, optimizer state and master copies live in MemoryX; one layer group "
                 "at a time streams onto the whole wafer, its gradients stream out")
"""The ``why`` of a weight-streaming plan (callers add how the mode was selected)."""


@dataclass(kw_only=True)
class LayerGroup:
    """Layers placed together in weight-streaming mode (one decoder block, an embedding, ...).

    ``name`` is the module path prefix (``blocks.3``) or first part (``wte``); ``layers`` its
    costs; ``params`` (elements), ``weight_bytes`` (float32 parameters and buffers),
    ``forward_flops`` and ``activation_bytes`` (per sample) are their sums.
    """

    name: str
    layers: list[LayerCost] = field(default_factory=list)
    params: int = 0
    weight_bytes: float = 0.0
    forward_flops: float = 0.0
    activation_bytes: float = 0.0

    def add(self, layer: LayerCost) -> None:
        """Add one layer and its costs."""
        self.layers.append(layer)
        self.params += layer.params
        self.weight_bytes += layer.weight_bytes
        self.forward_flops += layer.forward_flops
        self.activation_bytes += layer.activation_bytes


def group_name(layer: str) -> str:
    """``blocks.3.attn.qkv`` -> ``blocks.3``; ``wte`` -> ``wte``; ``<model>`` stays (see the module docstring)."""
    if layer == ROOT_LAYER:
        return layer
    parts = layer.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0]


def layer_groups(costs: list[LayerCost]) -> list[LayerGroup]:
    """The costs' layers grouped by :func:`group_name`, in the order each group is first reached."""
    groups: dict[str, LayerGroup] = {}
    for c in costs:
        groups.setdefault(group_name(c.name), LayerGroup(name=group_name(c.name))).add(c)
    return list(groups.values())


def memoryx_bytes(costs: list[LayerCost], spec: ProgramSpec) -> float:
    """MemoryX's share: float32 master weights, 16-bit copies (mixed precision), optimizer state, gradient sums."""
    total = 0.0
    for c in costs:
        total += c.weight_bytes + optimizer_state_bytes(c, spec) + gradient_bytes(c, spec)
        if spec.precision != "float32":  # mixed precision: 16-bit copies beside the float32 weights
            total += c.params * 2.0
    return total


def _resident(groups: list[LayerGroup], spec: ProgramSpec, micro: int) -> list[float]:
    """SRAM needed while each group runs with ``micro`` samples resident (the fit rule)."""
    train = spec.mode == "train"
    acts = [g.activation_bytes for g in groups]
    held = micro * (sum(acts) if train else (max(acts, default=0.0) * 2))
    out = []
    for i, g in enumerate(groups):
        nxt = groups[i + 1].weight_bytes if i + 1 < len(groups) else 0.0
        grads = g.params * 4.0 if train else 0.0
        out.append(g.weight_bytes + nxt + grads + held)
    return out


def micro_batch(groups: list[LayerGroup], spec: ProgramSpec, wafer: WaferSpec, batch: int) -> int:
    """The largest divisor of ``batch`` whose resident bytes fit every group; 0 when one sample does not fit."""
    for m in sorted((d for d in range(1, batch + 1) if batch % d == 0), reverse=True):
        if max(_resident(groups, spec, m), default=0.0) <= wafer.sram_bytes:
            return m
    return 0


def place_streaming(costs: list[LayerCost], spec: ProgramSpec, wafer: WaferSpec, memoryx: MemoryXSpec, *,
                    why: str = STREAMING_WHY) -> Plan:
    """The weight-streaming plan: groups one at a time, fit rule, MemoryX, throughput (module docstring)."""
    groups = layer_groups(costs)
    batch = max(int(spec.inputs[0].shape[0]) if spec.inputs and spec.inputs[0].shape else 1, 1)
    train = spec.mode == "train"
    micro = micro_batch(groups, spec, wafer, batch)
    run_micro = micro or 1
    passes = batch // run_micro
    resident = _resident(groups, spec, run_micro)
    mx_need = memoryx_bytes(costs, spec)
    per_elt = float(memoryx.stream_bytes_per_weight)
    bw_pe = wafer.memory_bandwidth_bytes_per_s / wafer.num_pes
    rows: list[LayerPlacement] = []
    step_s = 0.0
    w_in_total = g_out_total = 0.0
    for g, need in zip(groups, resident):
        fwd = g.forward_flops * run_micro
        work = 3.0 * fwd if train else fwd
        touched = (g.weight_bytes + g.activation_bytes * run_micro) * (3 if train else 1)
        pes = min(wafer.num_pes, max(1, math.ceil((work + touched) / wafer.min_flops_per_pe)))
        compute_s = max(work / (pes * wafer.pe_flops_per_s), touched / (bw_pe * pes))
        w_in = g.weight_bytes / 4.0 * per_elt
        g_out = g.params * per_elt if train else 0.0
        w_s = w_in / memoryx.weight_bandwidth_bytes_per_s
        g_s = g_out / memoryx.gradient_bandwidth_bytes_per_s
        if train:
            fwd_s, bwd_s = max(compute_s / 3.0, w_s), max(compute_s * 2.0 / 3.0, w_s, g_s)
            group_s = passes * (fwd_s + bwd_s)
            stream_s = passes * (w_s + max(w_s, g_s))
            w_in_total += passes * 2 * w_in
            g_out_total += passes * g_out
        else:
            group_s = passes * max(compute_s, w_s)
            stream_s = passes * w_s
            w_in_total += passes * w_in
        bound = "compute" if passes * compute_s >= stream_s else ("gradient stream" if g_s > w_s else "weight stream")
        step_s += group_s
        rows.append(LayerPlacement(
            name=g.name, module_type=f"layer group ({len(g.layers)} modules)", pes=pes,
            train_flops_per_sample=(3.0 if train else 1.0) * g.forward_flops, weight_bytes=g.weight_bytes,
            grad_bytes=sum(gradient_bytes(c, spec) for c in g.layers),
            optimizer_state_bytes=sum(optimizer_state_bytes(c, spec) for c in g.layers),
            activation_bytes=g.activation_bytes * run_micro, samples_in_flight=run_micro,
            sram_needed_bytes=need, sram_available_bytes=float(wafer.sram_bytes),
            stage_seconds_per_sample=group_s / batch, bound=bound))
    fits = micro > 0 and mx_need <= memoryx.capacity_bytes
    slowest = max(rows, key=lambda r: r.stage_seconds_per_sample, default=None)
    return Plan(wafer=wafer, layers=rows, sram_needed_bytes=max(resident, default=0.0),
                sram_available_bytes=float(wafer.sram_bytes), pes_used=max((r.pes for r in rows), default=0),
                fits=fits, est_samples_per_sec=batch / step_s if fits and step_s > 0 else 0.0,
                bottleneck=slowest.name if slowest else "", batch_size=batch, execution_strategy=WEIGHT_STREAMING,
                why=why, memoryx=memoryx, memoryx_needed_bytes=mx_need, micro_batch_size=micro,
                weight_stream_bytes_per_step=w_in_total, gradient_stream_bytes_per_step=g_out_total)
