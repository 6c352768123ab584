"""An engine step alone and beside a thread that holds the GIL: the scripted update against the general path.

Command (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/emulator/gil_neighbour.py [--steps 300] [--rounds 5]

The embedded engine runs on a thread of the chief's process, beside the training loop, which
holds the GIL while its Python runs. Every moment the engine needs the GIL while the loop holds
it, the step waits. This bench builds two :class:`~csrun.emulator.engine.executor.Engine` s for
configs/fc_mnist.yaml's model (10 x 50 ReLU MLP with its accuracy outputs, batch 128, SGD with
momentum 0.9, float16 by rounding): one with the scripted update (everything after the backward
in one TorchScript call: :class:`~csrun.emulator.engine.lean_step.ScriptedUpdate`), one with it off
(the general path: the rounding of the gradients, the unscaling and the lean update from
Python, then ``zero_grad``). Each runs ``--steps`` steps on the caller's thread (outputs handed
out as the embedded device does), alone, then with a neighbour thread that holds the GIL in
bursts (pure Python for 50 µs, then a 400 µs sleep: ~12 % of the GIL, about what the README
job's loop holds), alternating for ``--rounds`` rounds. Prints µs per step (medians) and the
neighbour's cost (with / alone) for each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "models" / "fc_mnist"))

from model import FcMnist, FcMnistConfig  # noqa: E402  # models/fc_mnist/model.py

from csrun.compiler.spec import OptimizerSpec, ProgramSpec  # noqa: E402
from csrun.emulator.embedded import outputs_to_cpu  # noqa: E402
from csrun.emulator.engine.executor import Engine  # noqa: E402

BURST_S, SLEEP_S = 50e-6, 400e-6


def engine_and_batch(scripted: bool) -> tuple[Engine, Any]:
    """An fc_mnist engine (float16 by rounding) with or without its scripted update, and a batch."""
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(128, 64, generator=g), torch.randint(0, 10, (128,), generator=g))
    torch.manual_seed(0)
    model = FcMnist(FcMnistConfig(mixed_precision=True))
    spec = ProgramSpec(optimizer=OptimizerSpec(type="sgd", hyperparameters={"momentum": 0.9}), learning_rate=1e-3,
                       precision="float16")
    engine = Engine(torch.export.export(model, (batch,)), spec, notice=lambda _m: None)
    if engine._scripted_update is None:
        raise SystemExit("the engine has no scripted update for this model: nothing to compare")
    if not scripted:
        engine._scripted_update = None
    return engine, batch


def us_per_step(step: Callable[[], Any], steps: int) -> float:
    """µs per step over ``steps`` steps, after 20 warm-up steps."""
    for _ in range(20):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps * 1e6


def with_neighbour(run: Callable[[], float]) -> float:
    """``run()`` while a thread holds the GIL in bursts."""
    stop = threading.Event()

    def neighbour() -> None:
        while not stop.is_set():
            until = time.perf_counter() + BURST_S
            n = 0
            while time.perf_counter() < until:
                n += 1
            time.sleep(SLEEP_S)

    thread = threading.Thread(target=neighbour, daemon=True)
    thread.start()
    try:
        return run()
    finally:
        stop.set()
        thread.join()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    engines = {name: engine_and_batch(name == "scripted") for name in ("scripted", "general")}
    alone: dict[str, list[float]] = {name: [] for name in engines}
    beside: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, (engine, batch) in engines.items():
            def step(engine: Engine = engine, batch: Any = batch) -> Any:
                return engine.run_step(batch, publish=outputs_to_cpu)

            alone[name].append(us_per_step(step, args.steps))
            beside[name].append(with_neighbour(lambda: us_per_step(step, args.steps)))
    print("| engine step (fc_mnist, float16 by rounding) | alone µs/step | beside a GIL-holding thread µs/step "
          "| with / alone (median of rounds) |")
    print("|---|---|---|---|")
    for name, label in (("scripted", "scripted update (default)"), ("general", "general path")):
        ratio = statistics.median(b / a for a, b in zip(alone[name], beside[name]))
        print(f"| {label} | {statistics.median(alone[name]):.1f} | {statistics.median(beside[name]):.1f} | "
              f"{ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
