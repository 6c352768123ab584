"""The engine's traced forward against its FX graph: first-step cost and steady step time.

Command (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/emulator/traced_forward.py [--steps 100] [--rounds 5] [--bert-base]

For the fc_mnist model of ``configs/fc_mnist.yaml`` (float32 and float16 by rounding) and the
BERT debug model (float32), times an :class:`~csrun.emulator.embedded.EmbeddedDevice` (the
engine on its worker thread; each step's loss is waited for) with ``CSRUN_ENGINE_TRACE=auto``
(a ``torch.jit.trace`` of the captured forward, checked bit for bit against the graph at the
first step) and ``off`` (the FX graph, run by its interpreter). Rounds alternate; the table gives
the first step's time (it includes building and checking the trace) and the median of the
per-round ratios of steady ms/step, trace / graph. ``--bert-base`` adds BERT-base (12 x 768,
MSL 128, batch 8, AdamW; two rounds of 3 steps: it takes minutes).

A lone engine thread shows only the interpreter's own cost; the trace's larger gain is that
the engine holds the GIL less while the chief's loop runs beside it (the end-to-end figures
in BENCHMARKS.md, ``bench/e2e/main_job.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench" / "emulator"))
sys.path.insert(0, str(REPO / "bench" / "compile"))

from half_precision import bert_debug, fc_mnist, loaded_device, ms_per_step  # noqa: E402  (bench/emulator/half_precision.py)

from csrun.compiler.spec import OptimizerSpec  # noqa: E402
from csrun.emulator.engine import traced_forward

Make = Callable[[], tuple[nn.Module, Any, OptimizerSpec]]


def bert_base() -> tuple[nn.Module, Any, OptimizerSpec]:
    """BERT-base (bench/compile's model), MSL 128, batch 8, AdamW."""
    from bench_compile import Bert, make_batch  # bench/compile/bench_compile.py

    model = Bert(vocab=30522, hidden=768, layers=12, heads=12, filt=3072, msl=128).train()
    return model, make_batch(8, 128, 30522), OptimizerSpec(type="adamw", hyperparameters={})


def run(make: Make, precision: str, mode: str, steps: int) -> tuple[float, float, str]:
    """(first step s, steady ms/step, the engine's forward type) with ``CSRUN_ENGINE_TRACE=mode``."""
    os.environ[traced_forward.ENV] = mode
    os.environ["CSRUN_HALF_EMULATION"] = "rounding"
    with loaded_device(make, precision) as (device, batch):
        t0 = time.perf_counter()
        device.submit(batch).result()
        first = time.perf_counter() - t0
        steady = ms_per_step(device, batch, steps, warmup=min(10, steps))
        kind = type(getattr(getattr(device, "_engine", None), "_forward", None)).__name__
        return first, steady, kind


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bert-base", action="store_true", help="add BERT-base batch 8 (minutes)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cases: list[tuple[str, Make, str, int, int]] = [
        ("fc_mnist, float32", fc_mnist, "float32", args.steps, args.rounds),
        ("fc_mnist, float16 by rounding", fc_mnist, "float16", args.steps, args.rounds),
        ("BERT debug, float32", bert_debug, "float32", max(args.steps // 5, 5), args.rounds),
    ]
    if args.bert_base:
        cases.append(("BERT-base batch 8, float32", bert_base, "float32", 3, 2))
    print("| model | first step, trace (s) | first step, graph (s) | steady ms/step, trace | steady ms/step, graph "
          "| trace / graph, steady (median) | engine ran |")
    print("|---|---|---|---|---|---|---|")
    for name, make, precision, steps, rounds in cases:
        rows: dict[str, list[tuple[float, float]]] = {"auto": [], "off": []}
        kinds: set[str] = set()
        for _ in range(rounds):
            for mode in ("off", "auto"):
                first, steady, kind = run(make, precision, mode, steps)
                rows[mode].append((first, steady))
                if mode == "auto":
                    kinds.add(kind)
        ratio = statistics.median(a[1] / o[1] for a, o in zip(rows["auto"], rows["off"]))
        med = {m: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for m, v in rows.items()}
        print(f"| {name} | {med['auto'][0]:.2f} | {med['off'][0]:.2f} | {med['auto'][1]:.3f} | {med['off'][1]:.3f} "
              f"| {ratio:.3f} | {', '.join(sorted(kinds))} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
