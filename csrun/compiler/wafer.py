"""The wafer model: how many processing elements (PEs), how much SRAM, how fast.

Defaults are the WSE-2 of the CS-2 system. Sources (the project's seed documents,
shared/seeds/001_*, the "Cerebras Wafer-Scale Engine (WSE-2)" slide text):

- 850,000 cores ("850,000 cores optimized for sparse linear algebra", "850,000 general
  purpose CPUs");
- 40 GB of on-chip SRAM ("40 gigabytes of on-chip memory", "40GB on-chip SRAM");
- 20 PB/s memory bandwidth ("20 PByte/s memory bandwidth");
- 220 Pbit/s fabric bandwidth (recorded here, not used by the estimate).

SRAM per PE is derived: 40 GB / 850,000 ≈ 47 KB (DESIGN.md rounds it to 48 KB).

**Assumptions** (not in the sources, stated as parameters so they can be changed): a clock
of 1.1 GHz and 4 FLOP per PE per cycle (one 16-bit FMA on a 2-wide SIMD lane). Every
number the compiler derives from these is an *estimate*.

:class:`MemoryXSpec` is the off-wafer weight store of weight-streaming mode (seed 001: "Weights
stored externally off-wafer", "Gradients streamed out of wafer", "Weight update occurs in
MemoryX"; seed 003: weights are taken "layer by layer ... from a large capacity memory service
called MemoryX"). The seeds give no capacity or bandwidth; the defaults are ASSUMPTIONS, stated
as parameters: 4 TB of capacity (the smallest MemoryX Cerebras announced) and 150 GB/s each way
between MemoryX and the wafer (the CS-2's 12 x 100 GbE links, full duplex).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class WaferSpec:
    """A wafer-scale engine as the placement sees it."""

    name: str = "WSE-2"
    """A label for reports."""
    num_pes: int = 850_000
    """Processing elements (seed 001: 850,000 cores)."""
    sram_bytes: int = 40_000_000_000
    """On-chip SRAM over all PEs (seed 001: 40 GB)."""
    memory_bandwidth_bytes_per_s: float = 20e15
    """Aggregate SRAM bandwidth (seed 001: 20 PB/s)."""
    fabric_bandwidth_bits_per_s: float = 220e15
    """PE-to-PE fabric bandwidth (seed 001: 220 Pbit/s); informational."""
    clock_hz: float = 1.1e9
    """ASSUMPTION: PE clock."""
    flops_per_pe_per_cycle: float = 4.0
    """ASSUMPTION: 16-bit FLOP one PE retires per cycle."""
    min_flops_per_pe: float = 256.0
    """ASSUMPTION: the least work per sample worth a PE of its own, counting a FLOP or a byte
    touched as one unit; caps how many PEs a small layer can use (a layer with F FLOP and B
    bytes touched per sample uses at most (F + B) / this PEs)."""

    @property
    def sram_bytes_per_pe(self) -> float:
        """SRAM of one PE (40 GB / 850,000 ≈ 47 KB by default)."""
        return self.sram_bytes / self.num_pes

    @property
    def pe_flops_per_s(self) -> float:
        """One PE's FLOP/s under the stated assumptions."""
        return self.clock_hz * self.flops_per_pe_per_cycle

    @property
    def peak_flops_per_s(self) -> float:
        """The whole wafer's FLOP/s under the stated assumptions."""
        return self.pe_flops_per_s * self.num_pes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for plan.json)."""
        return {**asdict(self), "sram_bytes_per_pe": self.sram_bytes_per_pe, "peak_flops_per_s": self.peak_flops_per_s}


WSE2 = WaferSpec()
"""The default: the WSE-2 of the CS-2."""


@dataclass(frozen=True, kw_only=True)
class MemoryXSpec:
    """The off-wafer store of weight-streaming mode: capacity and streaming bandwidths (ASSUMPTIONS)."""

    name: str = "MemoryX"
    """A label for reports."""
    capacity_bytes: float = 4e12
    """ASSUMPTION: bytes for float32 weights (master copies), optimizer state and the gradient
    sums of one step (4 TB, the smallest MemoryX announced)."""
    weight_bandwidth_bytes_per_s: float = 150e9
    """ASSUMPTION: weights streamed from MemoryX onto the wafer (12 x 100 GbE = 150 GB/s)."""
    gradient_bandwidth_bytes_per_s: float = 150e9
    """ASSUMPTION: gradients streamed from the wafer to MemoryX (the same links' other direction)."""
    stream_bytes_per_weight: int = 4
    """ASSUMPTION: bytes per weight or gradient element on the links (float32, as MemoryX stores them)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for plan.json and estimate.json)."""
        return asdict(self)


MEMORYX = MemoryXSpec()
"""The default MemoryX (ASSUMPTIONS above)."""
