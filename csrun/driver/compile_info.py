"""The figures a compile leaves for ``performance.json``: compile time and the estimate.

:func:`csrun.torch.compile_info` returns the :class:`CompileInfo` of the last compile on the
device path (None on the CPU, or before the first step compiled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from csrun.compiler.flow import CompileResult


@dataclass(frozen=True, kw_only=True)
class CompileInfo:
    """One compile's outcome as the runner reports it."""

    compile_time: float
    """Seconds the compile took (``CompileResult.seconds``; small on a cache hit)."""
    est_samples_per_sec: float | None
    """The wafer model's throughput estimate (from ``estimate.json``), None when not placed."""
    directory: str | None
    """The compile directory (``model_dir/cs_<hash>/`` or the explicit compile_dir)."""
    cache_hit: bool
    """An existing compile directory was reused."""
    mode: str
    """``train`` or ``eval``: the program compiled."""
    programming_time: float = 0.0
    """Seconds loading the program (and a pending state) onto the device; 0 for compile/validate only."""


def _estimate(estimate_json: dict[str, Any] | None) -> float | None:
    if not estimate_json:
        return None
    for key in ("est_samples_per_sec", "samples_per_sec", "estimated_samples_per_sec"):
        if isinstance(estimate_json.get(key), (int, float)):
            return float(estimate_json[key])
    return None


def from_result(result: CompileResult, mode: str) -> CompileInfo:
    """The figures of a :class:`~csrun.compiler.flow.CompileResult`."""
    return CompileInfo(compile_time=float(result.seconds), est_samples_per_sec=_estimate(result.estimate_json),
                       directory=result.directory, cache_hit=bool(result.cache_hit), mode=mode)
