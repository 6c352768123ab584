"""The emulator on a CUDA device against eager PyTorch on the same GPU: step time and the numbers.

Command (from the repository root, on a machine with a GPU)::

    python bench/emulator/on_cuda.py [--device cuda] [--steps 100] [--rounds 3]

For each model — fc_mnist (``configs/fc_mnist.yaml``'s 10 x 50 MLP, batch 128, SGD with
momentum), the BERT-like encoder of ``bench_emulator.py`` (vocab 4096, hidden 256, 4 layers,
batch 32 x 128 tokens, AdamW) and the BERT debug model (``configs/bert_debug.yaml``, its first
batch, AdamW) — it times ``--steps`` steps:

- ``emulator``: an :class:`~csrun.emulator.embedded.EmbeddedDevice` on the GPU (weights and
  optimizer state resident there, the engine on its worker thread): every step submitted, the
  last step's loss waited for, as a training loop that reads values in step closures does;
- ``eager``: the plain loop on the same GPU with the same optimizer (csrun's
  ``build_optimizer``, as the engine builds it): set the LR, forward, backward, step,
  zero_grad, one synchronize at the end.

Rounds alternate; the table gives the median ms per step and the median of the per-round ratios
(emulator / eager). "same numbers" compares the loss of every step of a fresh 10-step float32
run, emulator against eager, from the same initial weights, and gives the largest relative
difference. A float16 row (``precision: float16``: autocast on CUDA, the engine's default
there) gives its step time against float32 on the emulator.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_emulator import TinyBert  # noqa: E402  (bench/emulator/bench_emulator.py)
from half_precision import bert_debug, fc_mnist  # noqa: E402  (bench/emulator/half_precision.py)

from csrun.compiler.spec import OptimizerSpec, ProgramSpec  # noqa: E402
from csrun.emulator.embedded import EmbeddedDevice  # noqa: E402
from csrun.program.optimizer_classes import build_optimizer  # noqa: E402

LR = 1e-3
Make = Callable[[], tuple[nn.Module, Any, OptimizerSpec]]


def tiny_bert() -> tuple[nn.Module, Any, OptimizerSpec]:
    """bench_emulator's BERT-like encoder, a batch of 32 x 128 tokens and AdamW."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4096, (32, 128), generator=g)
    return TinyBert(), {"input_ids": ids, "labels": ids.roll(1, dims=1)}, OptimizerSpec(type="adamw")


def to_device(batch: Any, device: torch.device) -> Any:
    """The batch's tensors on ``device`` (tuples and dicts kept)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return type(batch)(to_device(v, device) for v in batch)


class Eager:
    """The plain loop on ``device`` with the optimizer the engine would build."""

    def __init__(self, model: nn.Module, batch: Any, opt: OptimizerSpec, device: torch.device) -> None:
        self.model = copy.deepcopy(model).to(device)
        self.batch = batch  # on the CPU, as a loader gives it: each step moves it, as the emulator does
        self.opt = build_optimizer(opt.type, dict(opt.hyperparameters), list(self.model.named_parameters()), lr=LR)
        self.device = device

    def losses(self, steps: int) -> list[float]:
        """Run ``steps`` steps; every step's loss (read at the end)."""
        out = [self._step() for _ in range(steps)]
        return [float(x) for x in torch.stack(out).cpu()]

    def ms(self, steps: int) -> float:
        """ms per step over ``steps`` steps (one synchronize at the end)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = self._step()
        loss.item()
        return (time.perf_counter() - t0) / steps * 1e3

    def _step(self) -> torch.Tensor:
        for group in self.opt.param_groups:
            group["lr"] = LR
        out = self.model(to_device(self.batch, self.device))
        loss = out["loss"] if isinstance(out, dict) else out
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


class Emulated:
    """An embedded device on ``device`` with the model's program loaded."""

    def __init__(self, model: nn.Module, batch: Any, opt: OptimizerSpec, device: torch.device, precision: str) -> None:
        program = torch.export.export(copy.deepcopy(model), (batch,))
        self.batch = batch
        self.dev = EmbeddedDevice(device=str(device), notice=lambda _m: None)
        self.dev.load(program, ProgramSpec(optimizer=opt, learning_rate=LR, precision=precision))

    def losses(self, steps: int) -> list[float]:
        """Run ``steps`` steps; every step's loss."""
        handles = [self.dev.submit(self.batch) for _ in range(steps)]
        return [float(h.result()["loss"]) for h in handles]

    def ms(self, steps: int) -> float:
        """ms per step over ``steps`` steps (the last one's loss waited for)."""
        t0 = time.perf_counter()
        handles = [self.dev.submit(self.batch) for _ in range(steps)]
        handles[-1].result()["loss"]
        return (time.perf_counter() - t0) / steps * 1e3

    def close(self) -> None:
        """Release the device."""
        self.dev.close()


def same_numbers(make: Make, device: torch.device) -> float:
    """The largest relative difference of a 10-step float32 run's losses, emulator against eager."""
    torch.manual_seed(0)
    model, batch, opt = make()
    emu = Emulated(model, batch, opt, device, "float32")
    try:
        a = emu.losses(10)
    finally:
        emu.close()
    b = Eager(model, batch, opt, device).losses(10)
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def timings(make: Make, device: torch.device, steps: int, rounds: int) -> dict[str, list[float]]:
    """ms per step of eager, the emulator in float32 and in float16, per round."""
    torch.manual_seed(0)
    model, batch, opt = make()
    runs: dict[str, Any] = {"eager": Eager(model, batch, opt, device),
                            "emulator": Emulated(model, batch, opt, device, "float32"),
                            "emulator float16": Emulated(model, batch, opt, device, "float16")}
    for run in runs.values():
        run.ms(10)  # warm up: kernels chosen, caches filled
    ms: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            ms[name].append(run.ms(steps))
    for run in runs.values():
        if isinstance(run, Emulated):
            run.close()
    return ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:I, or cpu for a smoke run")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench/emulator/on_cuda.py: no CUDA device visible", file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (a smoke run)"
    print(f"{where}, torch {torch.__version__}, {args.steps} steps x {args.rounds} rounds\n")
    print("| model | eager ms/step | emulator ms/step | emulator / eager (median of rounds) | rounds "
          "| float16 / float32 on the emulator | same numbers: largest relative loss difference, 10 steps |")
    print("|---|---|---|---|---|---|---|")
    for name, make in (("fc_mnist", fc_mnist), ("BERT-like encoder (bench_emulator)", tiny_bert),
                       ("BERT debug", bert_debug)):
        ms = timings(make, device, args.steps, args.rounds)
        ratios = [e / g for e, g in zip(ms["emulator"], ms["eager"])]
        half = [h / f for h, f in zip(ms["emulator float16"], ms["emulator"])]
        diff = same_numbers(make, device)
        print(f"| {name} | {statistics.median(ms['eager']):.3f} | {statistics.median(ms['emulator']):.3f} | "
              f"{statistics.median(ratios):.2f} | {', '.join(f'{r:.2f}' for r in ratios)} | "
              f"{statistics.median(half):.2f} | {diff:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
