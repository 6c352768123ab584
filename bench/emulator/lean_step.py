"""The engine's lean updates: SGD against ``torch.optim``'s ``SGD.step()`` (fc_mnist), and the
foreach AdamW without bias correction against its per-tensor form (BERT debug).

Command (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/emulator/lean_step.py [--steps 200] [--rounds 15] [--bert-steps 20]

Builds one :class:`~csrun.emulator.engine.executor.Engine` per precision (float16 by rounding, the
config's; float32) for configs/fc_mnist.yaml's model (10 x 50 ReLU MLP, batch 128, SGD with
momentum 0.9) and runs ``--steps`` steps on the caller's thread with the lean update
(:mod:`csrun.emulator.engine.lean_step`: the scripted update, everything after the backward in one
TorchScript call), then as many with ``optimizer.step()`` (and the general path's gradient
handling), alternating for ``--rounds`` rounds. Prints ms/step (medians) and the
median of the per-round ratios lean / ``optimizer.step()``, wall and CPU (thread) time.

Then the BERT debug model (``configs/bert_debug.yaml``'s model and first batch, float32) with
AdamW without bias correction (``correct_bias: false``, the model zoo's default: csrun's
:class:`~csrun.program.optimizer_classes.AdamWNoBiasCorrection`): ``--bert-steps`` steps with its
foreach update, then as many with the same formula one parameter at a time
(``tests/emulator/helpers.adamw_no_bias_correction_per_tensor``), alternating for
``--rounds`` rounds.
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

from half_precision import bert_debug, fc_mnist  # noqa: E402  (bench/emulator/half_precision.py)

from csrun.compiler.spec import OptimizerSpec, ProgramSpec  # noqa: E402
from csrun.emulator.engine.executor import Engine  # noqa: E402


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
    ap.add_argument("--bert-steps", type=int, default=20)
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
        lean, scripted = engine._lean_step, engine._scripted_update
        if lean is None:
            raise SystemExit("the engine has no lean update for SGD: nothing to compare")
        timed(engine, batch, 20)
        walls: dict[str, list[float]] = {"lean": [], "step": []}
        cpus: dict[str, list[float]] = {"lean": [], "step": []}
        for _ in range(args.rounds):
            for name in ("lean", "step"):
                engine._lean_step = lean if name == "lean" else None
                engine._scripted_update = scripted if name == "lean" else None
                wall, cpu = timed(engine, batch, args.steps)
                walls[name].append(wall)
                cpus[name].append(cpu)
        wall_ratio = statistics.median(a / b for a, b in zip(walls["lean"], walls["step"]))
        cpu_ratio = statistics.median(a / b for a, b in zip(cpus["lean"], cpus["step"]))
        print(f"| {precision} | {statistics.median(walls['lean']):.3f} | {statistics.median(walls['step']):.3f} | "
              f"{wall_ratio:.3f} | {cpu_ratio:.3f} |", flush=True)
    bench_adamw(args.bert_steps, args.rounds)
    return 0


def bench_adamw(steps: int, rounds: int) -> None:
    """BERT debug, float32: the foreach AdamW without bias correction against its per-tensor form."""
    from tests.emulator.helpers import adamw_no_bias_correction_per_tensor

    torch.manual_seed(0)
    model, batch, _ = bert_debug()
    spec = ProgramSpec(optimizer=OptimizerSpec(type="adamw", hyperparameters={"correct_bias": False,
                                                                              "weight_decay_rate": 0.01}),
                       learning_rate=1e-4, precision="float32")
    engine = Engine(torch.export.export(model, (batch,)), spec, "cpu", notice=lambda _m: None)
    opt = engine.optimizer
    if opt is None:
        raise SystemExit("the BERT engine has no optimizer")
    group = opt.param_groups[0]
    state: dict[int, list[torch.Tensor]] = {}
    foreach_step = opt.step

    def per_tensor_step() -> None:
        adamw_no_bias_correction_per_tensor(list(group["params"]), state, group["lr"], group["weight_decay"],
                                            group["eps"], group["betas"])

    timed(engine, batch, 3)
    walls: dict[str, list[float]] = {"foreach": [], "per-tensor": []}
    for _ in range(rounds):
        for name in walls:
            opt.step = foreach_step if name == "foreach" else per_tensor_step  # type: ignore[method-assign, assignment]
            walls[name].append(timed(engine, batch, steps)[0])
    ratio = statistics.median(a / b for a, b in zip(walls["foreach"], walls["per-tensor"]))
    print(f"\n| BERT debug, float32, AdamW without bias correction ({len(opt.param_groups)} groups) "
          f"| foreach ms/step | per-tensor ms/step | foreach / per-tensor (wall, median) |")
    print("|---|---|---|---|")
    print(f"| engine step | {statistics.median(walls['foreach']):.3f} | {statistics.median(walls['per-tensor']):.3f} "
          f"| {ratio:.3f} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
