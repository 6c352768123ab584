"""Mixed precision on the embedded emulator: float16 step time over float32 step time.

Command (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/emulator/half_precision.py [--steps 100] [--rounds 5]

For the fc_mnist model of ``configs/fc_mnist.yaml`` (10 x 50 ReLU MLP, batch 128, SGD with
momentum) and the BERT debug model (``configs/bert_debug.yaml``, its first batch, AdamW),
times steps of an :class:`~csrun.emulator.embedded.EmbeddedDevice` (the engine on its worker
thread; each step's loss is waited for) with float16 compute emulated by rounding on float32
kernels (``CSRUN_HALF_EMULATION=rounding``, the CPU default), with float16 under autocast
(16-bit CPU kernels), and in float32; rounds alternate, and the table gives the median of the
per-round ratios to float32 (target for rounding: <= 1.2).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from csrun.compiler.spec import OptimizerSpec, ProgramSpec  # noqa: E402
from csrun.emulator.embedded import EmbeddedDevice  # noqa: E402


class FcMnist(nn.Module):
    """configs/fc_mnist.yaml's model: 64 inputs, depth 10, hidden 50, 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = 64
        for _ in range(10):
            layers += [nn.Linear(width, 50), nn.ReLU()]
            width = 50
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(50, 10)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.head(self.body(x)), y)


def fc_mnist() -> tuple[nn.Module, Any, OptimizerSpec]:
    """The fc_mnist model, a batch of 128 and SGD with momentum."""
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(128, 64, generator=g), torch.randint(0, 10, (128,), generator=g))
    return FcMnist(), batch, OptimizerSpec(type="sgd", hyperparameters={"momentum": 0.9})


def bert_debug() -> tuple[nn.Module, Any, OptimizerSpec]:
    """The BERT debug model, its first batch and AdamW."""
    sys.path.insert(0, str(REPO / "tests"))
    from models.helpers import first_batch, load_module, load_params  # tests/models/helpers.py

    from csrun.data import hdf5_dataloader

    model_mod, data_mod = load_module("bert", "model"), load_module("bert", "data")
    params = load_params("bert_debug", model_mod.BertConfig, data_mod.BertInputConfig)
    batch = first_batch(hdf5_dataloader(data_mod.resolved(params.train_input), vocab_size=params.model.vocab_size))
    model = model_mod.BertPretrainModel(dataclasses.replace(params.model))
    return model, batch, OptimizerSpec(type="adamw", hyperparameters={})


@contextlib.contextmanager
def loaded_device(make: Callable[[], tuple[nn.Module, Any, OptimizerSpec]],
                  precision: str) -> Iterator[tuple[EmbeddedDevice, Any]]:
    """(an embedded device with ``make()``'s model loaded in ``precision``, its batch); closed after."""
    torch.manual_seed(0)
    model, batch, opt = make()
    program = torch.export.export(model, (batch,))
    spec = ProgramSpec(optimizer=opt, learning_rate=1e-4, precision=precision)
    device = EmbeddedDevice(notice=lambda _m: None)
    try:
        device.load(program, spec)
        yield device, batch
    finally:
        device.close()


def ms_per_step(device: EmbeddedDevice, batch: Any, steps: int, warmup: int = 10) -> float:
    """ms per step (each step's loss waited for), after ``warmup`` steps."""
    for _ in range(warmup):
        device.submit(batch).result()
    t0 = time.perf_counter()
    for _ in range(steps):
        device.submit(batch).result()
    return (time.perf_counter() - t0) / steps * 1e3


def step_ms(make: Callable[[], tuple[nn.Module, Any, OptimizerSpec]], precision: str, mode: str, steps: int) -> float:
    """ms per step on an embedded device, after 10 warm-up steps."""
    os.environ["CSRUN_HALF_EMULATION"] = mode
    with loaded_device(make, precision) as (device, batch):
        return ms_per_step(device, batch, steps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print("| model | float16 by rounding ms/step | float16 by autocast ms/step | float32 ms/step "
          "| rounding / float32 (median) | autocast / float32 (median) | target (rounding) |")
    print("|---|---|---|---|---|---|---|")
    for name, make in (("fc_mnist (10x50 MLP, batch 128, SGD)", fc_mnist), ("BERT debug (its batch, AdamW)", bert_debug)):
        times: dict[str, list[float]] = {"rounding": [], "autocast": [], "float32": []}
        for _ in range(args.rounds):
            times["float32"].append(step_ms(make, "float32", "rounding", args.steps))
            times["rounding"].append(step_ms(make, "float16", "rounding", args.steps))
            times["autocast"].append(step_ms(make, "float16", "autocast", args.steps))
        rnd = statistics.median(r / f for r, f in zip(times["rounding"], times["float32"]))
        auto = statistics.median(a / f for a, f in zip(times["autocast"], times["float32"]))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"| {name} | {med['rounding']:.3f} | {med['autocast']:.3f} | {med['float32']:.3f} | "
              f"{rnd:.2f} | {auto:.2f} | <= 1.2 |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
