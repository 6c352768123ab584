"""The cost of whole-step capture: the typical loop (loss outside the model) against model(batch) returning the loss.

Command (from the repository root)::

    .venv/bin/python bench/emulator/step_capture.py [--steps 200] [--rounds 5] [--batch 128]

One process, a lone chief, ``cs_ip="embedded"``, float32. The same 784-512-512-10 MLP is
trained two ways that compute the same thing: **model(batch)** — the forward takes the batch
and returns the cross-entropy loss and the accuracy (the recording is one call and no
operation); **general** — the forward returns logits, and the loop computes
``loss = criterion(outputs, targets)``, calls ``loss.backward()`` and ``optimizer.step()``,
then the accuracy ``(outputs.argmax(1) == targets).float().mean()`` (five recorded operations
on later steps, each checked against the compiled step). A third loop, **model(batch), loss
only**, leaves the accuracy out (the baseline before 2026-11-25, which charged the accuracy's
four operations on the device to the capture). None reads values per step (a closure at the
end only). The three alternate for ``--rounds`` rounds; the table gives each median step time
and the medians of the per-round ratios general / model(batch) (target <= 1.05) and general /
loss only. ``--batch 8`` shows the fixed per-step cost where the device's work is smallest.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import csrun.torch as cbtorch
from csrun.compiler import CompileSettings
from csrun.torch import process_state as state_mod


class Logits(nn.Module):
    """forward(x) -> logits."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class WithLoss(Logits):
    """forward(batch) -> (loss, accuracy): the general loop's math in the model."""

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        x, y = batch
        outputs = self.net(x)
        return nn.functional.cross_entropy(outputs, y), (outputs.argmax(1) == y).float().mean()


class LossOnly(Logits):
    """forward(batch) -> loss (no accuracy)."""

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)


MODELS: dict[str, type[Logits]] = {"model(batch)": WithLoss, "general": Logits, "loss only": LossOnly}
"""Each loop's model."""
LOOPS = tuple(MODELS)


def one_round(steps: int, batch_size: int, loop: str) -> float:
    """Seconds per step of ``loop`` (one of :data:`LOOPS`) for ``steps`` steps after a warm-up step (the compile)."""
    general = loop == "general"
    state_mod.reset_for_tests()
    cbtorch.initialize("embedded", settings=CompileSettings(mixed_precision=False),
                       model_dir="/tmp/csrun-bench-step-capture")
    torch.manual_seed(0)
    model = cbtorch.module(MODELS[loop]())
    opt = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch_size * 16, 784, generator=g), torch.randint(0, 10, (batch_size * 16,), generator=g)
    loader = cbtorch.dataloader(DataLoader(TensorDataset(x, y), batch_size=batch_size, drop_last=True))
    criterion = nn.CrossEntropyLoss()
    start = 0.0
    with cbtorch.Session(loader, mode="train", report=False):
        step = 0
        while step <= steps:
            for batch in loader:
                if step == 1:
                    cbtorch.get_state()  # the compile and the first step are done
                    start = time.perf_counter()
                opt.zero_grad()
                if general:
                    inputs, targets = batch
                    outputs = model(inputs)
                    loss = criterion(outputs, targets)
                    loss.backward()
                    opt.step()
                    accuracy = (outputs.argmax(1) == targets).float().mean()
                elif loop == "model(batch)":
                    loss, accuracy = model(batch)
                    loss.backward()
                    opt.step()
                else:
                    loss = model(batch)
                    loss.backward()
                    opt.step()
                    accuracy = loss
                step += 1
                if step > steps:
                    cbtorch.add_step_closure(lambda a, b: None, (loss, accuracy))
                    break
    cbtorch.get_state()
    return (time.perf_counter() - start) / steps


def main() -> None:
    """Alternate the three loops and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()
    torch.set_num_threads(1)
    times: dict[str, list[float]] = {loop: [] for loop in LOOPS}
    for _ in range(args.rounds):
        for loop in LOOPS:
            times[loop].append(one_round(args.steps, args.batch, loop))
    print(f"| loop (batch {args.batch}, {args.steps} steps x {args.rounds} rounds) | median ms/step |")
    print("|---|---|")
    print(f"| model(batch) returns the loss and the accuracy | {statistics.median(times['model(batch)']) * 1e3:.3f} |")
    print(f"| general: loss outside the model + accuracy | {statistics.median(times['general']) * 1e3:.3f} |")
    print(f"| model(batch) returns the loss only | {statistics.median(times['loss only']) * 1e3:.3f} |")
    for base, label in (("model(batch)", "general / model(batch)** (median of per-round ratios; target <= 1.05)"),
                        ("loss only", "general / loss only** (the earlier baseline)")):
        ratios = [g / b for g, b in zip(times["general"], times[base])]
        print(f"| **{label} | **{statistics.median(ratios):.3f}** (rounds: {', '.join(f'{r:.3f}' for r in ratios)}) |")


if __name__ == "__main__":
    main()
