"""The engine's whole step compiled (``CSRUN_COMPILED_STEP=on``) against its step op by op and
against an eager PyTorch step, for fc_mnist and BERT debug in float32.

Command (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/emulator/compiled_step.py [--steps 200] [--rounds 5] [--bert-steps 20]

For each model (configs/fc_mnist.yaml's MLP with SGD and momentum, batch 128; BERT debug's model
and first batch with AdamW: ``bench/emulator/half_precision.py``) it builds three things from
the same weights: an :class:`~csrun.emulator.engine.executor.Engine` running the step op by op
(``CSRUN_COMPILED_STEP=off``, today's path), one running the compiled whole step (``on``:
inductor), and the model itself with ``torch.optim``'s optimizer stepped eagerly (the baseline).
It times the compiled engine's build (the first two steps: the first op by op, the second traces
and compiles; inductor's cache in ``/tmp/torchinductor_<user>`` makes a second process's build
shorter), then runs ``--steps`` steps of each in turn for ``--rounds`` rounds and prints ms/step
(median), each ratio to the eager step (median of the rounds' ratios) and the CPU ms per step
(this thread's).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from half_precision import bert_debug, fc_mnist  # noqa: E402  (bench/emulator/half_precision.py)

from csrun.compiler.spec import ProgramSpec  # noqa: E402
from csrun.emulator.engine.executor import Engine  # noqa: E402


def timed(step: Callable[[], Any], steps: int) -> tuple[float, float]:
    """(wall ms, CPU ms of this thread) per step over ``steps`` steps."""
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps * 1e3, (time.thread_time() - c0) / steps * 1e3


def engine(model: torch.nn.Module, batch: Any, spec: ProgramSpec, mode: str) -> Engine:
    """An engine for ``model`` with ``CSRUN_COMPILED_STEP=mode``."""
    os.environ["CSRUN_COMPILED_STEP"] = mode
    return Engine(torch.export.export(copy.deepcopy(model), (batch,)), spec, "cpu", notice=print)


def eager(model: torch.nn.Module, batch: Any, kind: str) -> Callable[[], Any]:
    """The eager PyTorch step of ``model`` (its own copy) with the spec's optimizer."""
    own = copy.deepcopy(model)
    opt: torch.optim.Optimizer = (torch.optim.SGD(own.parameters(), lr=1e-4, momentum=0.9) if kind == "sgd"
                                  else torch.optim.AdamW(own.parameters(), lr=1e-4))

    def step() -> None:
        opt.zero_grad()
        out = own(batch)
        loss = out["loss"] if isinstance(out, dict) else out[0] if isinstance(out, tuple) else out
        loss.backward()
        opt.step()
    return step


def bench(name: str, make: Callable[[], tuple[torch.nn.Module, Any, Any]], steps: int, rounds: int) -> None:
    """One model's row."""
    torch.manual_seed(0)
    model, batch, opt_spec = make()
    spec = ProgramSpec(optimizer=opt_spec, learning_rate=1e-4, precision="float32")
    today = engine(model, batch, spec, "off")
    compiled = engine(model, batch, spec, "on")
    t0, c0 = time.perf_counter(), time.process_time()
    compiled.run_step(batch)
    compiled.run_step(batch)  # the compile
    build, build_cpu = time.perf_counter() - t0, time.process_time() - c0
    if compiled._compiled is None:
        raise SystemExit(f"{name}: the step was not compiled")
    runs = {"eager": eager(model, batch, opt_spec.type), "op by op": lambda: today.run_step(batch),
            "compiled": lambda: compiled.run_step(batch)}
    for run in runs.values():
        timed(run, 3)
    walls: dict[str, list[float]] = {k: [] for k in runs}
    cpus: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for key, run in runs.items():
            wall, cpu = timed(run, steps)
            walls[key].append(wall)
            cpus[key].append(cpu)
    med = statistics.median

    def ratio(key: str) -> float:
        return med(a / b for a, b in zip(walls[key], walls["eager"]))
    print(f"| {name} | {med(walls['eager']):.3f} ({med(cpus['eager']):.3f}) | {med(walls['op by op']):.3f} "
          f"({med(cpus['op by op']):.3f}) | {ratio('op by op'):.2f} | {med(walls['compiled']):.3f} "
          f"({med(cpus['compiled']):.3f}) | {ratio('compiled'):.2f} | "
          f"{', '.join(f'{a / b:.2f}' for a, b in zip(walls['compiled'], walls['eager']))} | "
          f"{build:.1f} ({build_cpu:.1f}) |", flush=True)


def main() -> int:
    """Measure and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bert-steps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print("| model (float32) | eager ms/step (CPU) | op by op ms/step (CPU) | op by op / eager | compiled ms/step "
          "(CPU) | compiled / eager (median) | rounds | build s (CPU s) |")
    print("|---|---|---|---|---|---|---|---|")
    bench("fc_mnist, SGD momentum, batch 128", fc_mnist, args.steps, args.rounds)
    bench("BERT debug, AdamW", bert_debug, args.bert_steps, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
