"""The engine's lean SGD update against ``torch.optim``'s ``SGD.step()``, on the fc_mnist step.

Command (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/emulator/lean_step.py [--steps 200] [--rounds 15]

Builds one :class:`~csrun.emulator.engine.Engine` per precision (float16 by rounding, the
config's; float32) for configs/fc_mnist.yaml's model (10 x 50 ReLU MLP, batch 128, SGD with
momentum 0.9) and runs ``--steps`` steps on the caller's thread with the lean update
(:mod:`csrun.emulator.lean_step`: torch's ``_multi_tensor_sgd`` called directly), then as many
with ``optimizer.step()``, alternating for ``--rounds`` rounds. Prints ms/step (medians) and the
median of the per-round ratios lean / ``optimizer.step()``, wall and CPU (thread) time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from half_precision import fc_mnist  # noqa: E402  (bench/emulator/half_precision.py)

from csrun.compiler.spec import ProgramSpec  # noqa: E402
from csrun.emulator.engine import Engine  # noqa: E402


def timed(engine: Engine, batch: object, steps: int) -> tuple[float, float]:
    """(wall ms, CPU ms) per step over ``steps`` steps."""
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(steps):
        engine.run_step(batch)
    return (time.perf_counter() - t0) / steps * 1e3, (time.thread_time() - c0) / steps * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    os.environ.pop("CSRUN_HALF_EMULATION", None)
    print("| precision | lean ms/step | `optimizer.step()` ms/step | lean / step() (wall, median) "
          "| lean / step() (CPU, median) |")
    print("|---|---|---|---|---|")
    for precision in ("float16", "float32"):
        torch.manual_seed(0)
        model, batch, opt = fc_mnist()
        engine = Engine(torch.export.export(model, (batch,)),
                        ProgramSpec(optimizer=opt, learning_rate=1e-4, precision=precision), "cpu",
                        notice=lambda _m: None)
        lean = engine._lean_step
        if lean is None:
            raise SystemExit("the engine has no lean update for SGD: nothing to compare")
        timed(engine, batch, 20)
        walls: dict[str, list[float]] = {"lean": [], "step": []}
        cpus: dict[str, list[float]] = {"lean": [], "step": []}
        for _ in range(args.rounds):
            for name in ("lean", "step"):
                engine._lean_step = lean if name == "lean" else None
                wall, cpu = timed(engine, batch, args.steps)
                walls[name].append(wall)
                cpus[name].append(cpu)
        wall_ratio = statistics.median(a / b for a, b in zip(walls["lean"], walls["step"]))
        cpu_ratio = statistics.median(a / b for a, b in zip(cpus["lean"], cpus["step"]))
        print(f"| {precision} | {statistics.median(walls['lean']):.3f} | {statistics.median(walls['step']):.3f} | "
              f"{wall_ratio:.3f} | {cpu_ratio:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
