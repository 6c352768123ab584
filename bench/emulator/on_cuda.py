"""The emulator on a CUDA device against eager PyTorch on the same GPU: step time and the numbers.

Command (from the repository root, on a machine with a GPU)::

    python bench/emulator/on_cuda.py [--device cuda] [--steps 100] [--rounds 3] [--numbers-steps 100]
                                     [--models fc_mnist,bert_like,bert_debug] [--no-compile]

For each model — fc_mnist (``configs/fc_mnist.yaml``'s 10 x 50 MLP, batch 128, SGD with
momentum), the BERT-like encoder of ``bench_emulator.py`` (vocab 4096, hidden 256, 4 layers,
batch 32 x 128 tokens, AdamW) and the BERT debug model (``configs/bert_debug.yaml``, its first
batch, AdamW) — it times ``--steps`` steps:

- ``graph``: an :class:`~csrun.emulator.embedded.EmbeddedDevice` on the GPU (weights and
  optimizer state resident there, the engine on its worker thread), each step's forward and
  backward replayed as a CUDA graph (:mod:`csrun.emulator.engine.cuda_graph`, the default): every
  step submitted, the last step's loss waited for, as a training loop that reads values in step
  closures does;
- ``no graph``: the same with ``CSRUN_CUDA_GRAPH=off`` (every kernel launched, as before the graph);
- ``eager``: the plain loop on the same GPU with the same optimizer (csrun's
  ``build_optimizer``, as the engine builds it): set the LR, forward, backward, step,
  zero_grad, one synchronize at the end;
- ``compile``: that loop with the model under ``torch.compile(mode="reduce-overhead")`` (its
  forward and backward as CUDA graphs; the optimizer eager, as in ``eager``).

Rounds alternate; the table gives the median ms per step and the medians of the per-round ratios.
"first steps" times a fresh graphed device's first steps one by one: the mean of the warm-up
steps (run without a graph; the first one watched for ops a graph cannot hold) and the step
that captures the graph and replays it once. "same numbers" compares the loss of every step of
a fresh ``--numbers-steps``-step float32 run, graphed emulator against eager, from the same
initial weights, and gives the largest relative difference (0: the same bits). A float16 row
(``precision: float16``: autocast on CUDA, the engine's default there) gives its step time
against float32, both graphed. ``--device cpu`` is a smoke run of this script (no graph, no compile).
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
from torch import nn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_emulator import TinyBert  # noqa: E402  (bench/emulator/bench_emulator.py)
from half_precision import bert_debug, fc_mnist  # noqa: E402  (bench/emulator/half_precision.py)

from csrun.compiler.spec import OptimizerSpec, ProgramSpec  # noqa: E402
from csrun.emulator.embedded import EmbeddedDevice  # noqa: E402
from csrun.emulator.engine import cuda_graph  # noqa: E402
from csrun.program.optimizer_classes import build_optimizer  # noqa: E402

LR = 1e-3
Make = Callable[[], tuple[nn.Module, Any, OptimizerSpec]]


def tiny_bert() -> tuple[nn.Module, Any, OptimizerSpec]:
    """bench_emulator's BERT-like encoder, a batch of 32 x 128 tokens and AdamW."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4096, (32, 128), generator=g)
    return TinyBert(), {"input_ids": ids, "labels": ids.roll(1, dims=1)}, OptimizerSpec(type="adamw")


MODELS: dict[str, tuple[str, Make]] = {
    "fc_mnist": ("fc_mnist", fc_mnist),
    "bert_like": ("BERT-like encoder (bench_emulator)", tiny_bert),
    "bert_debug": ("BERT debug", bert_debug),
}
"""The models, by the name ``--models`` takes: (the table's name, what makes it)."""


def to_device(batch: Any, device: torch.device) -> Any:
    """The batch's tensors on ``device`` (tuples and dicts kept)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return type(batch)(to_device(v, device) for v in batch)


class Eager:
    """The plain loop on ``device`` with the optimizer the engine would build (``compiled``: the
    model under ``torch.compile(mode="reduce-overhead")``)."""

    def __init__(self, model: nn.Module, batch: Any, opt: OptimizerSpec, device: torch.device,
                 compiled: bool = False) -> None:
        self.model = copy.deepcopy(model).to(device)
        self.batch = batch  # on the CPU, as a loader gives it: each step moves it, as the emulator does
        self.opt = build_optimizer(opt.type, dict(opt.hyperparameters), list(self.model.named_parameters()), lr=LR)
        self.device = device
        self.forward: Callable[[Any], Any] = torch.compile(self.model, mode="reduce-overhead") if compiled \
            else self.model

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
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # each call a new step for the compiled graphs
        out = self.forward(to_device(self.batch, self.device))
        loss = out["loss"] if isinstance(out, dict) else out
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


class Emulated:
    """An embedded device on ``device`` with the model's program loaded."""

    def __init__(self, model: nn.Module, batch: Any, opt: OptimizerSpec, device: torch.device, precision: str,
                 graph: bool = True) -> None:
        program = torch.export.export(copy.deepcopy(model), (batch,))
        self.batch = batch
        self.notices: list[str] = []
        self.dev = EmbeddedDevice(device=str(device), notice=self.notices.append)
        before = os.environ.get(cuda_graph.ENV)
        os.environ[cuda_graph.ENV] = "auto" if graph else "off"  # read when the engine is built
        try:
            self.dev.load(program, ProgramSpec(optimizer=opt, learning_rate=LR, precision=precision))
        finally:
            if before is None:
                os.environ.pop(cuda_graph.ENV)
            else:
                os.environ[cuda_graph.ENV] = before

    def first_steps(self, count: int) -> list[float]:
        """ms of each of the first ``count`` steps, each waited for."""
        out = []
        for _ in range(count):
            t0 = time.perf_counter()
            self.dev.submit(self.batch).result()
            out.append((time.perf_counter() - t0) * 1e3)
        return out

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

    def graph_said(self) -> str:
        """What the step's graph did: ``replayed N of M steps`` and its notices (said at step 1 or
        at the capture; a graph that fell back must not pass for one that replayed)."""
        graph = getattr(self.dev._engine, "step_graph", None)
        done = f"replayed {graph.replays} of {graph.steps} steps" if graph is not None else "no step graph"
        said = [n for n in self.notices if n.startswith("CUDA graph")]
        return "; ".join([done, *said])

    def close(self) -> None:
        """Release the device."""
        self.dev.close()


def same_numbers(make: Make, device: torch.device, steps: int) -> float:
    """The largest relative difference of a ``steps``-step float32 run's losses, graphed emulator against eager."""
    torch.manual_seed(0)
    model, batch, opt = make()
    emu = Emulated(model, batch, opt, device, "float32")
    try:
        a = emu.losses(steps)
    finally:
        emu.close()
    b = Eager(model, batch, opt, device).losses(steps)
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def first_steps(make: Make, device: torch.device) -> tuple[float, float]:
    """A fresh graphed device's warm-up steps (mean ms) and its capture step (ms)."""
    torch.manual_seed(0)
    model, batch, opt = make()
    emu = Emulated(model, batch, opt, device, "float32")
    try:
        ms = emu.first_steps(cuda_graph.WARMUP_STEPS + 1)
    finally:
        emu.close()
    return statistics.mean(ms[:-1]), ms[-1]


def timings(make: Make, device: torch.device, steps: int, rounds: int, compiled: bool) -> dict[str, list[float]]:
    """ms per step of each run, per round (``compiled``: with the ``torch.compile`` run, on a GPU)."""
    torch.manual_seed(0)
    model, batch, opt = make()
    runs: dict[str, Any] = {"eager": Eager(model, batch, opt, device),
                            "graph": Emulated(model, batch, opt, device, "float32"),
                            "no graph": Emulated(model, batch, opt, device, "float32", graph=False),
                            "graph float16": Emulated(model, batch, opt, device, "float16")}
    if device.type == "cuda" and compiled:
        runs["compile"] = Eager(model, batch, opt, device, compiled=True)
    for run in runs.values():
        run.ms(10)  # warm up: kernels chosen, caches filled
    ms: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            ms[name].append(run.ms(steps))
    for name, run in runs.items():
        if isinstance(run, Emulated):
            if name != "no graph":
                print(f"  {name}: {run.graph_said()}", file=sys.stderr, flush=True)
            run.close()
    return ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:I, or cpu for a smoke run")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--numbers-steps", type=int, default=100, help="steps of the same-numbers run")
    ap.add_argument("--models", default=",".join(MODELS), help=f"a comma-separated choice of {', '.join(MODELS)}")
    ap.add_argument("--no-compile", action="store_true", help="leave the torch.compile column out (its compile "
                                                              "takes a minute or more per model)")
    args = ap.parse_args()
    chosen = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in MODELS]
    if unknown or not chosen:
        print(f"bench/emulator/on_cuda.py: --models {args.models!r}: choose from {', '.join(MODELS)}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench/emulator/on_cuda.py: no CUDA device visible", file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (a smoke run)"
    print(f"{where}, torch {torch.__version__}, {args.steps} steps x {args.rounds} rounds\n")
    print("| model | eager ms/step | compile ms/step | no graph ms/step | graph ms/step | graph / eager "
          "(median of rounds) | rounds | graph / compile | no graph / eager | float16 / float32 (graph) "
          "| first steps: warm-up ms/step, capture ms | same numbers: largest relative loss difference |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")

    def median(values: list[float]) -> str:
        return f"{statistics.median(values):.3f}" if values else "-"

    for key in chosen:
        name, make = MODELS[key]
        ms = timings(make, device, args.steps, args.rounds, compiled=not args.no_compile)
        ratios = [e / g for e, g in zip(ms["graph"], ms["eager"])]
        vs_compile = [e / c for e, c in zip(ms["graph"], ms.get("compile", []))]
        plain = [e / g for e, g in zip(ms["no graph"], ms["eager"])]
        half = [h / f for h, f in zip(ms["graph float16"], ms["graph"])]
        warm, capture = first_steps(make, device)
        diff = same_numbers(make, device, args.numbers_steps)
        print(f"| {name} | {median(ms['eager'])} | {median(ms.get('compile', []))} | {median(ms['no graph'])} | "
              f"{median(ms['graph'])} | {statistics.median(ratios):.2f} | {', '.join(f'{r:.2f}' for r in ratios)} | "
              f"{f'{statistics.median(vs_compile):.2f}' if vs_compile else '-'} | {statistics.median(plain):.2f} | {statistics.median(half):.2f} | "
              f"{warm:.1f}, {capture:.1f} | {diff:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
