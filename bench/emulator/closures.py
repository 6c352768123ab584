"""Step closures every step against none, on the embedded emulator through csrun.torch.

Command (from the repository root)::

    .venv/bin/python bench/emulator/closures.py [--steps 200] [--rounds 5]

One process, a lone chief (no streamers), ``cs_ip="embedded"``: the same MLP (784-512-512-10,
batch 128, SGD + momentum, float32) is trained for ``--steps`` steps per round three ways:
with a closure that reads the loss at every step, with the same closure as
``run_async=True``, and with no closure at all (the loss is read once, at the end, through
``get_state``), alternating for ``--rounds`` rounds. Prints the median step time of each and
the median of the per-round ratios (target <= 1.02) as a markdown table. A plain closure
makes the chief wait for its step's outputs (handed out after the forward, before the
update), so the chief's own work for the next step (here mostly the DataLoader) overlaps
only the device's backward and update; an async closure waits on a thread instead.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import csrun.torch as cbtorch
from csrun.compiler import CompileSettings
from csrun.torch import process_state as state_mod


class MLP(nn.Module):
    """784-512-512-10 with ReLU; forward returns the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)


def one_round(steps: int, closures: bool, run_async: bool = False) -> float:
    """Seconds per step for ``steps`` steps after a warm-up step (the compile)."""
    state_mod.reset_for_tests()
    cbtorch.initialize("embedded", settings=CompileSettings(mixed_precision=False, learning_rate=0.01), model_dir="/tmp/csrun-bench-closures")
    torch.manual_seed(0)
    model = cbtorch.module(MLP())
    opt = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(128 * 8, 784, generator=g), torch.randint(0, 10, (128 * 8,), generator=g)
    loader = cbtorch.dataloader(DataLoader(TensorDataset(x, y), batch_size=128, drop_last=True))
    seen: list[float] = []
    start = 0.0
    with cbtorch.Session(loader, mode="train", report=False):
        step = 0
        while step <= steps:
            for batch in loader:
                if step == 1:
                    start = time.perf_counter()
                loss = model(batch)
                loss.backward()
                opt.step()
                opt.zero_grad()
                if closures:
                    cbtorch.add_step_closure(lambda v: seen.append(float(v)), args=(loss,), run_async=run_async)
                step += 1
                if step > steps:
                    break
        cbtorch.get_state()  # wait for every step
        elapsed = time.perf_counter() - start
    return elapsed / steps


def main() -> int:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with_c, with_async, without = [], [], []
    for _ in range(args.rounds):
        without.append(one_round(args.steps, closures=False))
        with_c.append(one_round(args.steps, closures=True))
        with_async.append(one_round(args.steps, closures=True, run_async=True))
    print(f"| measurement | ms/step with closures | ms/step without | median ratio (n={args.rounds}) | target |")
    print("|---|---|---|---|---|")
    for label, runs in (("closure every step / none", with_c), ("run_async closure every step / none", with_async)):
        ratios = [a / b for a, b in zip(runs, without)]
        print(f"| {label}, embedded, MLP 784-512-512-10 bs 128 | {statistics.median(runs) * 1e3:.3f} | "
              f"{statistics.median(without) * 1e3:.3f} | {statistics.median(ratios):.3f} | <= 1.02 |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
