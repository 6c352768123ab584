"""``model_dir/performance/performance.json``: how fast the run went, and why.

Keys (legacy names first):

``total_samples``        samples the chief trained on in this invocation (steps x batch size)
``total_time``           seconds from the first batch request to the last step's end
``samples_per_sec``      ``total_samples / total_time``
``compile_time``         seconds the compile took (None on the CPU path or when unknown)
``programming_time``     seconds loading the program onto the device (None when unknown)
``est_samples_per_sec``  the compile's throughput estimate (system path; None on the CPU)
``per_ordinal``          one entry per streamer: ordinal, node, batches, samples_per_sec,
                         mb_per_sec, pipeline_s, credit_wait_s (empty for a lone chief)
``suspected_input_bottleneck``  the chief waited for input more than the threshold share
``path``                 ``cpu`` or ``system``; ``mode``; ``global_step`` at the end
``stream``               the session's full stream statistics (``StreamStats.to_dict()``)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from csrun.files import atomic_write


def performance_doc(*, total_samples: int, total_time: float, batch_size: int, stats: Any,
                    compile_info: dict[str, Any], path: str, mode: str, global_step: int) -> dict[str, Any]:
    """The performance.json content (``stats``: a ``StreamStats`` or None)."""
    stream = stats.to_dict() if stats is not None else {}
    per_ordinal = []
    for s in stream.get("streamers", []):
        per_ordinal.append({
            "ordinal": s.get("rank"), "node": s.get("node"), "batches": s.get("batches"),
            "samples_per_sec": s.get("batches_per_s", 0.0) * batch_size,
            "mb_per_sec": s.get("mb_per_s"), "pipeline_s": s.get("pipeline_s"),
            "credit_wait_s": s.get("credit_wait_s"),
        })
    return {
        "total_samples": total_samples,
        "total_time": total_time,
        "samples_per_sec": total_samples / total_time if total_time > 0 else 0.0,
        "compile_time": compile_info.get("compile_time"),
        "programming_time": compile_info.get("programming_time"),
        "est_samples_per_sec": compile_info.get("est_samples_per_sec"),
        "per_ordinal": per_ordinal,
        "suspected_input_bottleneck": bool(stream.get("input_bound", False)),
        "path": path,
        "mode": mode,
        "global_step": global_step,
        "stream": stream,
    }


def write_performance(model_dir: Path, doc: dict[str, Any]) -> Path:
    """Write ``performance/performance.json`` (atomically: temp file, rename)."""
    folder = Path(model_dir) / "performance"
    folder.mkdir(parents=True, exist_ok=True)
    return atomic_write(folder / "performance.json", json.dumps(doc, indent=2, default=str) + "\n")
