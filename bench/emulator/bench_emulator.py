"""Emulator overheads as ratios from one run, printed as a markdown table.

Run from the repository root::

    python bench/emulator/bench_emulator.py            # full run (a few minutes on 2 cores)
    python bench/emulator/bench_emulator.py --quick    # fewer steps, for a smoke check

Measurements (float32 compute on both sides, so the work is identical):

1. embedded emulator step time / eager PyTorch loop step time, for an MLP and a small BERT-like
   encoder (target <= 1.05). The eager loop sets the LR, runs forward, backward, the optimizer
   step and zero_grad, and reads the loss only at the end, as the emulator's caller does. An
   info row runs the same Engine on the caller's thread, to separate the cost of executing the
   captured program from the cost of handing steps to the worker thread (on 2 cores, waking the
   submitting thread once per step takes a core from the intra-op threads).
2. server (``cs_emulator`` in a separate process, over loopback TCP) / embedded step time with
   batches of ~4 MB (target <= 1.15).
3. link throughput for large tensors (one 64 MiB float32 tensor per frame, wire format) / a raw
   loopback socket moving the same bytes (target >= 0.8).

Each pair is measured alternately, several rounds, and the median per-step time is used, so
noise from other processes hits both sides alike. For the embedded rows the ratio of process CPU
time is printed too: on a shared machine it shows the emulator's own overhead when wall time is
dominated by other load.
"""

from __future__ import annotations

import argparse
import copy
import os
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import torch
from torch import nn

from csrun.compiler.spec import OptimizerSpec, ProgramSpec
from csrun.emulator.remote import wire
from csrun.emulator.remote.client import RemoteDevice
from csrun.emulator.embedded import EmbeddedDevice
from csrun.emulator.engine.executor import Engine


class MLP(nn.Module):
    """784 -> 1024 -> 1024 -> 10 classifier."""

    def __init__(self, d_in: int = 784, hidden: int = 1024) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 10))

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)


class TinyBert(nn.Module):
    """A BERT-like masked-LM encoder: vocab 4096, hidden 256, 4 layers, 4 heads, filter 1024, MSL 128."""

    def __init__(self, vocab: int = 4096, d: int = 256, layers: int = 4, seq: int = 128) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, activation="gelu", batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"]
        h = self.enc(self.tok(ids) + self.pos.weight[: ids.shape[1]])
        logits = self.head(self.norm(h))
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1))


def _spec(opt: str, hp: dict[str, Any], lr: float) -> ProgramSpec:
    return ProgramSpec(optimizer=OptimizerSpec(type=opt, hyperparameters=hp), learning_rate=lr, precision="float32")


def eager_time(model: nn.Module, batches: list[Any], make_opt: Callable[[list], torch.optim.Optimizer],
               lr: float) -> tuple[float, float]:
    """(wall, process CPU) seconds per step of a plain eager loop."""
    m = copy.deepcopy(model)
    opt = make_opt(list(m.parameters()))
    loss = torch.zeros(())
    c0 = time.process_time()
    t0 = time.perf_counter()
    for b in batches:
        for g in opt.param_groups:
            g["lr"] = lr
        loss = m(b)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    loss.item()
    n = len(batches)
    return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


def device_time(dev: Any, batches: list[Any]) -> tuple[float, float]:
    """(wall, process CPU) seconds per step through a device: submit all, wait for the last.
    Process CPU covers this process only (for a remote device, the client side)."""
    c0 = time.process_time()
    t0 = time.perf_counter()
    handles = [dev.submit(b) for b in batches]
    handles[-1].result()
    n = len(batches)
    return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


def alternate(rounds: int, *fns: Callable[[], tuple[float, float]]) -> list[tuple[float, float]]:
    """Median (wall, cpu) of each function over alternating rounds."""
    results: list[list[tuple[float, float]]] = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            results[i].append(fn())
    return [(statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for r in results]


def bench_embedded(name: str, model: nn.Module, batches: list[Any], opt: str, hp: dict[str, Any],
                   make_opt: Callable[[list], torch.optim.Optimizer], rounds: int) -> tuple[tuple[float, float], ...]:
    """(embedded device, engine on the caller's thread, eager) (wall, cpu) seconds per step."""
    ep = torch.export.export(model, (batches[0],))
    dev = EmbeddedDevice(notice=lambda m: None)
    dev.load(ep, _spec(opt, hp, 1e-3))
    engine = Engine(ep, _spec(opt, hp, 1e-3), notice=lambda m: None)

    def direct() -> tuple[float, float]:
        c0, t0 = time.process_time(), time.perf_counter()
        for b in batches:
            out = engine.run_step(b)
        out["loss"].item()
        return (time.perf_counter() - t0) / len(batches), (time.process_time() - c0) / len(batches)

    device_time(dev, batches[:3])  # warm up
    eager_time(model, batches[:3], make_opt, 1e-3)
    emu, inline, eager = alternate(rounds, lambda: device_time(dev, batches), direct,
                                   lambda: eager_time(model, batches, make_opt, 1e-3))
    dev.close()
    return emu, inline, eager


def start_server(token: str) -> tuple[subprocess.Popen, str]:
    """A cs_emulator process on a free port; returns it and its address."""
    env = dict(os.environ, CSRUN_EMULATOR_TOKEN=token)
    proc = subprocess.Popen([sys.executable, "-m", "csrun.cli.cs_emulator", "--listen", "127.0.0.1:0",
                             "--log-level", "warning"], env=env, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout is not None else ""
    if "listening on " not in line:
        proc.kill()
        raise RuntimeError(f"cs_emulator did not start (printed {line!r})")
    return proc, line.split("listening on ")[1].split()[0]


def bench_server(steps: int, rounds: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """(server, embedded) (wall, client cpu) seconds per step with 4 MiB batches."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(1024, 1024, generator=g), torch.randint(0, 10, (1024,), generator=g)) for _ in range(steps)]
    model = MLP(d_in=1024, hidden=512)
    ep = torch.export.export(model, (batches[0],))
    spec = _spec("sgd", {"momentum": 0.9}, 1e-3)
    token = secrets.token_urlsafe(32)
    proc, address = start_server(token)
    try:
        remote = RemoteDevice(address, token, "bench")
        remote.load(ep, spec)
        local = EmbeddedDevice(notice=lambda m: None)
        local.load(ep, spec)
        device_time(remote, batches[:3])
        device_time(local, batches[:3])
        srv, emb = alternate(rounds, lambda: device_time(remote, batches), lambda: device_time(local, batches))
        remote.close()
        local.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return srv, emb


def bench_link(mib: int, frames: int, rounds: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """(wire, raw) bytes per second over loopback TCP for large tensors."""
    tensor = torch.randn(mib * (1 << 20) // 4)
    nbytes = tensor.numel() * 4
    limits = wire.Limits(max_tensor_bytes=nbytes, max_frame_bytes=nbytes)

    def pair() -> tuple[socket.socket, socket.socket]:
        lst = socket.create_server(("127.0.0.1", 0))
        a = socket.create_connection(lst.getsockname())
        b, _ = lst.accept()
        lst.close()
        return a, b

    def run_wire() -> tuple[float, float]:
        a, b = pair()
        out: list[float] = []

        def recv() -> None:
            for _ in range(frames):
                wire.recv_frame(b, limits)
            out.append(time.perf_counter())

        t = threading.Thread(target=recv)
        t0 = time.perf_counter()
        t.start()
        for _ in range(frames):
            wire.send_frame(a, {"op": "x"}, [tensor])
        t.join()
        a.close()
        b.close()
        return frames * nbytes / (out[0] - t0), 0.0

    def run_raw() -> tuple[float, float]:
        a, b = pair()
        payload = memoryview(tensor.numpy()).cast("B")
        out: list[float] = []

        def recv() -> None:
            for _ in range(frames):
                buf = bytearray(nbytes)
                view = memoryview(buf)
                got = 0
                while got < nbytes:
                    got += b.recv_into(view[got:], nbytes - got)
            out.append(time.perf_counter())

        t = threading.Thread(target=recv)
        t0 = time.perf_counter()
        t.start()
        for _ in range(frames):
            a.sendall(payload)
        t.join()
        a.close()
        b.close()
        return frames * nbytes / (out[0] - t0), 0.0

    wire_rate, raw_rate = alternate(rounds, run_wire, run_raw)
    return wire_rate, raw_rate


def main(argv: list[str] | None = None) -> int:
    """Run every measurement and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    args = p.parse_args(argv)
    steps, rounds = (8, 3) if args.quick else (20, 5)
    torch.manual_seed(0)
    rows = []

    g = torch.Generator().manual_seed(1)
    mlp_batches = [(torch.randn(256, 784, generator=g), torch.randint(0, 10, (256,), generator=g)) for _ in range(steps)]
    emu, inline, eager = bench_embedded("mlp", MLP(), mlp_batches, "sgd", {"momentum": 0.9},
                                        lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9), rounds)
    rows.append(("embedded / eager, MLP 784-1024-1024-10, bs 256, SGD+momentum", emu[0] * 1e3, eager[0] * 1e3,
                 "ms/step", emu[0] / eager[0], emu[1] / eager[1], "<= 1.05"))
    rows.append(("(engine on the caller's thread) / eager, same MLP", inline[0] * 1e3, eager[0] * 1e3,
                 "ms/step", inline[0] / eager[0], inline[1] / eager[1], "(info)"))

    bert_batches = [{"input_ids": torch.randint(0, 4096, (16, 128), generator=g),
                     "labels": torch.randint(0, 4096, (16, 128), generator=g)} for _ in range(max(4, steps // 2))]
    emu, inline, eager = bench_embedded("bert", TinyBert(), bert_batches, "adamw", {"weight_decay": 0.01},
                                        lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01), rounds)
    rows.append(("embedded / eager, BERT-like 4x256 MSL 128, bs 16, AdamW", emu[0] * 1e3, eager[0] * 1e3,
                 "ms/step", emu[0] / eager[0], emu[1] / eager[1], "<= 1.05"))
    rows.append(("(engine on the caller's thread) / eager, same BERT-like", inline[0] * 1e3, eager[0] * 1e3,
                 "ms/step", inline[0] / eager[0], inline[1] / eager[1], "(info)"))

    srv, emb = bench_server(steps, rounds)
    rows.append(("server / embedded, 4 MiB batches (MLP 1024-512-512-10, bs 1024)", srv[0] * 1e3, emb[0] * 1e3,
                 "ms/step", srv[0] / emb[0], None, "<= 1.15"))

    (wire_bps, _), (raw_bps, _) = bench_link(64, 4 if args.quick else 8, rounds)
    rows.append(("link / raw loopback socket, 64 MiB tensors", wire_bps / 2**30, raw_bps / 2**30, "GiB/s",
                 wire_bps / raw_bps, None, ">= 0.8"))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"{steps} steps x {rounds} rounds (medians)\n")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average at the end: {load:.2f} (wall ratios suffer when other work shares the cores; "
          f"the CPU-time ratio counts this process's CPU seconds, all threads)\n")
    print("| measurement | emulator | baseline | unit | ratio (wall) | ratio (CPU time) | target |")
    print("|---|---:|---:|---|---:|---:|---|")
    for name, a, b, unit, ratio, cpu_ratio, target in rows:
        cpu = f"{cpu_ratio:.3f}" if cpu_ratio is not None else "-"
        print(f"| {name} | {a:.3f} | {b:.3f} | {unit} | {ratio:.3f} | {cpu} | {target} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
