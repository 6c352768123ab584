"""Placement: give each layer a region of PEs, check SRAM, estimate steady-state throughput.

Pipelined mode keeps everything on the wafer: float32 weights, their gradients, optimizer
state, and the activations of every sample in flight. Layer *i* of *n* (pipeline order)
holds activations for ``2·(n − i) − 1`` samples: a sample's activations stay until its
backward pass comes back through the layer.

Regions: each layer first gets the PEs its memory needs; the rest of the wafer is shared in
proportion to training FLOP (water-filling) to each layer's single-PE stage
time (FLOP / PE FLOP/s + bytes touched / per-PE bandwidth), so stages come out balanced; no
layer takes more PEs than its work can use (FLOP + bytes touched over
``WaferSpec.min_flops_per_pe``). A layer's stage time per sample is the larger of its
compute time (FLOP / region FLOP/s) and its memory time (bytes touched / region bandwidth);
the pipeline's steady state is one sample per slowest stage. All of it is an *estimate*.

:class:`Plan` is the result of either execution strategy (:mod:`csrun.program.execution`):
:func:`place` is the pipelined placement, :func:`csrun.compiler.streaming.place_streaming` the
weight-streaming one (rows are then layer groups, placed one at a time). ``plan.json`` and
``estimate.json`` say which (``execution_strategy``) and why (``why``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from csrun.compiler.costs import LayerCost, gradient_bytes, optimizer_state_bytes
from csrun.compiler.spec import ProgramSpec
from csrun.compiler.wafer import MemoryXSpec, WaferSpec
from csrun.program.execution import PIPELINE, WEIGHT_STREAMING


@dataclass(kw_only=True)
class LayerPlacement:
    """One layer's region and its numbers (bytes are totals for the layer, FLOP per sample)."""

    name: str
    module_type: str
    pes: int
    """PEs in the layer's region."""
    train_flops_per_sample: float
    weight_bytes: float
    grad_bytes: float
    optimizer_state_bytes: float
    activation_bytes: float
    """Activations of all samples in flight at this layer."""
    samples_in_flight: int
    sram_needed_bytes: float
    sram_available_bytes: float
    stage_seconds_per_sample: float
    """Estimate: the slower of compute and memory time for one sample."""
    bound: str
    """``compute`` or ``memory``: which limited the stage."""

    @property
    def fits(self) -> bool:
        """The region's SRAM holds the layer's bytes."""
        return self.sram_needed_bytes <= self.sram_available_bytes


@dataclass(kw_only=True)
class Plan:
    """A placement of a program on a wafer, with the fit and throughput estimates."""

    wafer: WaferSpec
    layers: list[LayerPlacement] = field(default_factory=list)
    sram_needed_bytes: float = 0.0
    sram_available_bytes: float = 0.0
    pes_used: int = 0
    fits: bool = True
    est_samples_per_sec: float = 0.0
    bottleneck: str = ""
    """The slowest stage's layer."""
    batch_size: int = 1
    execution_strategy: str = PIPELINE
    """``pipeline`` or ``weight_streaming`` (:mod:`csrun.program.execution`)."""
    why: str = ""
    """Which mode and why, for plan.json, estimate.json and the report."""
    memoryx: MemoryXSpec | None = None
    """Weight streaming: the MemoryX model (capacity, bandwidths); None when pipelined."""
    memoryx_needed_bytes: float = 0.0
    """Weight streaming: master weights, 16-bit copies, optimizer state and gradient sums held in MemoryX."""
    micro_batch_size: int = 0
    """Weight streaming: samples whose activations are resident at once (the batch runs as
    ``batch_size / micro_batch_size`` passes whose gradients are summed); 0 when pipelined."""
    weight_stream_bytes_per_step: float = 0.0
    """Weight streaming: bytes streamed from MemoryX onto the wafer per step."""
    gradient_stream_bytes_per_step: float = 0.0
    """Weight streaming: gradient bytes streamed off the wafer per step."""

    @property
    def streaming(self) -> bool:
        """True for a weight-streaming plan."""
        return self.execution_strategy == WEIGHT_STREAMING

    @property
    def total_utilization(self) -> float:
        """Fraction of the wafer's PEs given to a region (estimate)."""
        return self.pes_used / self.wafer.num_pes if self.wafer.num_pes else 0.0

    @property
    def memory_utilization(self) -> float:
        """Fraction of the wafer's SRAM the program needs (estimate; > 1 does not fit)."""
        return self.sram_needed_bytes / self.sram_available_bytes if self.sram_available_bytes else math.inf

    @property
    def compute_utilization(self) -> float:
        """Achieved FLOP/s at the estimated rate over the assumed peak (estimate)."""
        flops = sum(l.train_flops_per_sample for l in self.layers)
        peak = self.wafer.peak_flops_per_s
        return flops * self.est_samples_per_sec / peak if peak else 0.0

    def biggest_layers(self, n: int = 10) -> list[LayerPlacement]:
        """The layers needing the most SRAM, biggest first."""
        return sorted(self.layers, key=lambda l: l.sram_needed_bytes, reverse=True)[:n]

    def _streaming_json(self) -> dict[str, Any]:
        if self.memoryx is None:
            return {}
        return {"memoryx": {**self.memoryx.to_dict(), "needed_bytes": self.memoryx_needed_bytes,
                            "fits": self.memoryx_needed_bytes <= self.memoryx.capacity_bytes},
                "micro_batch_size": self.micro_batch_size,
                "weight_stream_bytes_per_step": self.weight_stream_bytes_per_step,
                "gradient_stream_bytes_per_step": self.gradient_stream_bytes_per_step}

    def plan_json(self) -> dict[str, Any]:
        """The content of ``plan.json``."""
        return {
            "estimate": True,
            "note": "all figures are estimates from the wafer model (csrun.compiler.wafer)",
            "execution_strategy": self.execution_strategy,
            "why": self.why,
            "batch_size": self.batch_size,
            **self._streaming_json(),
            "wafer": self.wafer.to_dict(),
            "total_utilization": self.total_utilization,
            "memory_utilization": self.memory_utilization,
            "compute_utilization": self.compute_utilization,
            "pes_used": self.pes_used,
            "sram_needed_bytes": self.sram_needed_bytes,
            "sram_available_bytes": self.sram_available_bytes,
            "fits": self.fits,
            "layers": [{**asdict(l), "fits": l.fits} for l in self.layers],
        }

    @staticmethod
    def from_json(plan: dict[str, Any], estimate: dict[str, Any]) -> "Plan":
        """Rebuild a plan from ``plan.json`` and ``estimate.json`` (for reports on a cache hit)."""
        wafer_fields = {f for f in WaferSpec.__dataclass_fields__}
        wafer = WaferSpec(**{k: v for k, v in plan["wafer"].items() if k in wafer_fields})
        layer_fields = {f for f in LayerPlacement.__dataclass_fields__}
        layers = [LayerPlacement(**{k: v for k, v in row.items() if k in layer_fields}) for row in plan["layers"]]
        mx = plan.get("memoryx")
        memoryx = MemoryXSpec(**{k: v for k, v in mx.items() if k in MemoryXSpec.__dataclass_fields__}) if mx else None
        return Plan(wafer=wafer, layers=layers, sram_needed_bytes=plan["sram_needed_bytes"],
                    sram_available_bytes=plan["sram_available_bytes"], pes_used=plan["pes_used"], fits=plan["fits"],
                    est_samples_per_sec=estimate["est_samples_per_sec"], bottleneck=estimate.get("bottleneck_layer", ""),
                    batch_size=estimate.get("batch_size", 1),
                    execution_strategy=plan.get("execution_strategy", PIPELINE), why=plan.get("why", ""),
                    memoryx=memoryx, memoryx_needed_bytes=mx["needed_bytes"] if mx else 0.0,
                    micro_batch_size=plan.get("micro_batch_size", 0),
                    weight_stream_bytes_per_step=plan.get("weight_stream_bytes_per_step", 0.0),
                    gradient_stream_bytes_per_step=plan.get("gradient_stream_bytes_per_step", 0.0))

    def estimate_json(self) -> dict[str, Any]:
        """The content of ``estimate.json``."""
        assumptions: dict[str, Any] = {"clock_hz": self.wafer.clock_hz,
                                       "flops_per_pe_per_cycle": self.wafer.flops_per_pe_per_cycle,
                                       "min_flops_per_pe": self.wafer.min_flops_per_pe}
        if self.memoryx is not None:
            assumptions.update(
                weight_bandwidth_bytes_per_s=self.memoryx.weight_bandwidth_bytes_per_s,
                gradient_bandwidth_bytes_per_s=self.memoryx.gradient_bandwidth_bytes_per_s,
                stream_bytes_per_weight=self.memoryx.stream_bytes_per_weight,
                memoryx_capacity_bytes=self.memoryx.capacity_bytes)
        return {
            "estimate": True,
            "execution_strategy": self.execution_strategy,
            "why": self.why,
            "est_samples_per_sec": self.est_samples_per_sec,
            "est_steps_per_sec": self.est_samples_per_sec / self.batch_size if self.batch_size else 0.0,
            "batch_size": self.batch_size,
            "bottleneck_layer": self.bottleneck,
            "total_utilization": self.total_utilization,
            "compute_utilization": self.compute_utilization,
            "fits": self.fits,
            **({"micro_batch_size": self.micro_batch_size,
                "weight_stream_bytes_per_step": self.weight_stream_bytes_per_step,
                "gradient_stream_bytes_per_step": self.gradient_stream_bytes_per_step} if self.streaming else {}),
            "assumptions": assumptions,
        }


def _allocate(min_pes: list[int], caps: list[int], weights: list[float], total: int) -> list[int]:
    """Water-filling: pes_i = clamp(alpha·w_i, min_i, cap_i) with the largest alpha that fits."""
    wsum = sum(weights)
    if sum(min_pes) >= total or wsum <= 0:
        return list(min_pes)
    w = [x * total / wsum for x in weights]

    def alloc(alpha: float) -> list[int]:
        return [max(m, min(c, int(alpha * x))) for m, c, x in zip(min_pes, caps, w)]

    lo, hi = 0.0, 1.0
    while sum(alloc(hi)) < total:
        if all(p >= c for p, c in zip(alloc(hi), caps)):
            return alloc(hi)  # every layer at the most it can use
        lo, hi = hi, hi * 2
    for _ in range(50):
        mid = (lo + hi) / 2
        if sum(alloc(mid)) <= total:
            lo = mid
        else:
            hi = mid
    return alloc(lo)


PIPELINE_WHY = ("pipelined: every layer keeps its weights, gradients, optimizer state and the activations of "
                "the samples in flight in its own region of the wafer")
"""The ``why`` of a pipelined plan (the default strategy)."""


def place(costs: list[LayerCost], spec: ProgramSpec, wafer: WaferSpec, *, why: str = PIPELINE_WHY) -> Plan:
    """Place the layers on the wafer pipelined and estimate fit and throughput (see module docstring)."""
    n = len(costs)
    batch = spec.inputs[0].shape[0] if spec.inputs and spec.inputs[0].shape else 1
    train = spec.mode == "train"
    per_pe = wafer.sram_bytes_per_pe
    rows = []
    for i, c in enumerate(costs):
        in_flight = max(2 * (n - i) - 1, 1) if train else 1
        need = c.weight_bytes + gradient_bytes(c, spec) + optimizer_state_bytes(c, spec) + c.activation_bytes * in_flight
        rows.append((c, in_flight, need))
    min_pes = [max(1, math.ceil(need / per_pe)) for _, _, need in rows]
    work = [(c.train_flops if train else c.forward_flops) for c, _, _ in rows]
    touched = [(c.weight_bytes + c.activation_bytes) * (3 if train else 1) for c, _, _ in rows]
    # Single-PE stage time of each layer; regions in proportion to it balance the stages.
    one_pe = [w / wafer.pe_flops_per_s + b / (wafer.memory_bandwidth_bytes_per_s / wafer.num_pes)
              for w, b in zip(work, touched)]
    caps = [max(m, math.ceil((w + b) / wafer.min_flops_per_pe)) for m, w, b in zip(min_pes, work, touched)]
    pes = _allocate(min_pes, caps, one_pe, wafer.num_pes)
    total_need = sum(need for _, _, need in rows)
    fits = total_need <= wafer.sram_bytes and sum(min_pes) <= wafer.num_pes
    layers = []
    for (c, in_flight, need), p, w, b in zip(rows, pes, work, touched):
        compute_s = w / (p * wafer.pe_flops_per_s) if w else 0.0
        memory_s = b / (wafer.memory_bandwidth_bytes_per_s * p / wafer.num_pes)
        layers.append(LayerPlacement(
            name=c.name, module_type=c.module_type, pes=p, train_flops_per_sample=w,
            weight_bytes=float(c.weight_bytes), grad_bytes=gradient_bytes(c, spec),
            optimizer_state_bytes=optimizer_state_bytes(c, spec),
            activation_bytes=c.activation_bytes * in_flight, samples_in_flight=in_flight,
            sram_needed_bytes=need, sram_available_bytes=p * per_pe,
            stage_seconds_per_sample=max(compute_s, memory_s), bound="compute" if compute_s >= memory_s else "memory"))
    slowest = max(layers, key=lambda l: l.stage_seconds_per_sample, default=None)
    rate = 1.0 / slowest.stage_seconds_per_sample if slowest and slowest.stage_seconds_per_sample > 0 else 0.0
    return Plan(wafer=wafer, layers=layers, sram_needed_bytes=total_need, sram_available_bytes=float(wafer.sram_bytes),
                pes_used=min(sum(pes), wafer.num_pes) if fits else sum(min_pes), fits=fits,
                est_samples_per_sec=rate if fits else 0.0, bottleneck=slowest.name if slowest else "", batch_size=int(batch),
                why=why)
