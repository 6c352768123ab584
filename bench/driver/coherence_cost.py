"""What keeping the host and the device coherent costs per step (csrun.driver.coherence).

Command (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/driver/coherence_cost.py [--steps 2000] [--rounds 3]

The chief's :class:`~csrun.driver.coherence.Coherence` runs at every step: at the step's first
model call, after each call, at ``optimizer.step()``, at the step's boundary (the host's edits,
the trainable set, each group's hyperparameters), into the step's plan, and when the step is
sent. This runs exactly those calls for ``--steps`` steps on two models with AdamW (fc_mnist's
784-256-10 MLP, 4 tensors; twelve Linear + LayerNorm blocks, 48 tensors, GPT-2-like in count),
and, in the same round, the eager PyTorch training step of the same model on a batch of 128
(the baseline: what a step costs a user who runs no device). Prints one markdown table: the
microseconds of Python per step (median over rounds), the eager step's, their ratio, and the
CPU seconds of each (a process that waits would show wall time without CPU time).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
from torch import nn

from csrun.driver.coherence import Coherence
from csrun.program.step_plan import FULL_STEP


def models() -> list[tuple[str, nn.Module, tuple[int, ...]]]:
    """(name, model, input shape) of each model measured."""
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64)) for _ in range(12)])
    return [("fc_mnist (4 tensors)", nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)),
             (128, 1, 28, 28)),
            ("12 blocks (48 tensors)", blocks, (128, 64))]


def timed(fn: Callable[[], None], steps: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) per call of ``fn`` over ``steps`` calls."""
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - w0) / steps, (time.process_time() - c0) / steps


def coherence_step(model: nn.Module) -> Callable[[], None]:
    """One step's coherence calls, as the driver makes them for a one-call training step (on an
    optimizer of its own: attaching watches the optimizer's state)."""
    coherence = Coherence(notice=print)
    coherence.attach_model(model)
    coherence.attach_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3), lambda: None)
    coherence.loaded(trains=True, host_lr=True, host_current=True)
    params = list(model.parameters())
    state = {"param_names": [n for n, _ in model.named_parameters()],
             "optimizer": {"param_groups": [{"params": list(range(len(params)))}]}}

    def step() -> None:
        coherence.before_step(True)
        coherence.after_call(False)
        coherence.stepped(None)
        coherence.at_boundary(True)
        coherence.plan(FULL_STEP, lambda: state)
        coherence.sent(True)
    return step


def eager_step(model: nn.Module, optimizer: torch.optim.Optimizer, shape: tuple[int, ...]) -> Callable[[], None]:
    """The same model's eager training step (the baseline)."""
    x = torch.randn(shape)
    width = model(x).shape[-1]
    y = torch.randint(0, width, (shape[0],))

    def step() -> None:
        optimizer.zero_grad()
        out = model(x)
        nn.functional.cross_entropy(out.reshape(-1, out.shape[-1])[: shape[0]], y).backward()
        optimizer.step()
    return step


def main() -> int:
    """Measure and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    print("| model | coherence, µs/step (CPU µs) | eager step, µs (CPU µs) | coherence / eager step | rounds |")
    print("|---|---|---|---|---|")
    for name, model, shape in models():
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ours, eager, ratios = [], [], []
        for _ in range(args.rounds):  # alternating: both see the same machine
            c = timed(coherence_step(model), args.steps)
            e = timed(eager_step(model, optimizer, shape), max(args.steps // 10, 20))
            ours.append(c)
            eager.append(e)
            ratios.append(c[0] / e[0])
        med = statistics.median
        print(f"| {name} | {med(w for w, _ in ours) * 1e6:.1f} ({med(c for _, c in ours) * 1e6:.1f}) | "
              f"{med(w for w, _ in eager) * 1e6:.0f} ({med(c for _, c in eager) * 1e6:.0f}) | {med(ratios):.3f} | "
              f"{', '.join(f'{r:.3f}' for r in ratios)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
