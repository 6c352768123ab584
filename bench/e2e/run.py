"""End-to-end runner benchmark: checkpoint cost and fc_mnist throughput through csrun.

Run (from the repository root; the local Slurm cluster is used when ``SLURM_CONF`` points at
it, else csrun_wse falls back to ``mpiexec``)::

    OMP_NUM_THREADS=1 CSRUN_PYTHON=/tmp/probe-venv/bin/python \\
        /tmp/probe-venv/bin/python bench/e2e/run.py

Prints one markdown table of ratios measured in this run:

a. **Checkpoint save + load** of a BERT-base-sized state (110M float32 weights would be
   0.44 GB; the default is a 32M-parameter model with SGD momentum, 256 MB on disk, set by
   ``BENCH_CKPT_PARAMS``): csrun's ``save_checkpoint`` (temp file, sha256 while writing,
   fsync, rename, checksum file, fsync folder) + ``load_checkpoint`` (checksum verified,
   ``weights_only=True``) over bare ``torch.save(path)`` + ``torch.load(path, weights_only=True)``
   of the same state to the same folder (target <= 1.3). Median of ``BENCH_REPEAT`` (5)
   paired trials, alternating which goes first, ``sync`` between pairs; once on the scratch
   folder's disk (fsync included: bare torch.save does not fsync) and once on ``/dev/shm``
   (tmpfs: fsync costs nothing, so the ratio is csrun's own work: hashing, temp file, renames);
   on disk also against a baseline that fsyncs its file too (the same durability).
b. **fc_mnist samples/s** (configs/fc_mnist.yaml model: depth 10, hidden 50, batch 128;
   ``BENCH_STEPS`` steps, default 1500, no checkpoints) through ``models/fc_mnist/run.py``:
   ``csrun_cpu`` (eager CPU, lone chief), ``csrun_wse`` with 1 and 2 streamers (embedded
   emulator on the chief), each over a plain single-process PyTorch loop on the same model,
   data, batch size and optimizer (DataLoader + SGD, nothing else). The csrun figure is
   ``performance.json``'s ``samples_per_sec`` (first batch request to last step end,
   compile included on the emulator path); the plain loop is timed the same way. The
   emulator rows run once with the config's mixed precision (float16 compute, emulated on
   the CPU) and once with ``mixed_precision: false`` (float32, what the plain loop does).

Environment: ``BENCH_STEPS``, ``BENCH_CKPT_PARAMS``, ``BENCH_REPEAT``, ``BENCH_DIR`` (scratch
folder, default a temp dir), ``CSRUN_PYTHON`` (the Python the launchers run).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / "bin"
FC_MNIST = REPO / "models" / "fc_mnist"


def bench_checkpoint(folder: Path, params: int, repeat: int, fsync: bool = False) -> tuple[float, float, float]:
    """(ratio, csrun seconds, bare seconds) for save+load of a ``params``-parameter state."""
    from csrun.run.checkpoints import load_checkpoint, save_checkpoint

    n_layers = 8
    width = int((params / n_layers) ** 0.5)
    model = {f"layer{i}.weight": torch.randn(width, width) for i in range(n_layers)}
    state = {"model": model,
             "optimizer": {"state": {i: {"momentum_buffer": torch.randn(width, width)} for i in range(n_layers)},
                           "param_groups": [{"lr": 0.1, "momentum": 0.9, "params": list(range(n_layers))}]},
             "lr_scheduler": {"global_step": 1000}, "amp": {}, "global_step": 1000, "data_position": 1000}
    ours, bare = [], []

    def run_ours(i: int) -> None:
        t = time.perf_counter()
        load_checkpoint(save_checkpoint(folder, i, state))
        ours.append(time.perf_counter() - t)

    def run_bare(i: int) -> None:
        t = time.perf_counter()
        plain = folder / f"plain_{i}.pt"
        torch.save(state, plain)
        if fsync:  # the same durability as csrun's save
            with open(plain, "rb+") as f:
                os.fsync(f.fileno())
        torch.load(plain, weights_only=True)
        bare.append(time.perf_counter() - t)

    for i in range(repeat):  # alternate who goes first: the disk's write-back hits the next writer
        first, second = (run_ours, run_bare) if i % 2 == 0 else (run_bare, run_ours)
        first(i)
        second(i)
        os.sync()
        for p in folder.iterdir():
            p.unlink()
    o, b = statistics.median(ours), statistics.median(bare)
    return o / b, o, b


def plain_loop(steps: int) -> float:
    """samples/s of a bare PyTorch loop on fc_mnist's model and data (this process)."""
    import importlib.util

    def load(name: str, file: str):  # the model's files by path (run.py's siblings)
        spec = importlib.util.spec_from_file_location(name, FC_MNIST / file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    model_mod = load("model", "model.py")
    data_mod = load("data", "data.py")
    from csrun.run.params import params_from_dict

    params = params_from_dict(yaml.safe_load((REPO / "configs" / "fc_mnist.yaml").read_text()),
                              model_config=model_mod.FcMnistConfig, input_config=model_mod.FcMnistInputConfig)
    torch.manual_seed(1)
    model = model_mod.FcMnist(params.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    loader = data_mod.train_input_fn(params)
    step = 0
    t0 = time.perf_counter()
    while step < steps:
        for batch in loader:
            opt.zero_grad()
            model(batch)["loss"].backward()
            opt.step()
            step += 1
            if step == steps:
                break
    return steps * params.train_input.batch_size / (time.perf_counter() - t0)


def csrun_rate(launcher: list[str], folder: Path, steps: int, mixed_precision: bool) -> float:
    """performance.json samples_per_sec of one fc_mnist run through a launcher."""
    cfg = yaml.safe_load((REPO / "configs" / "fc_mnist.yaml").read_text())
    cfg["runconfig"].update(max_steps=steps, checkpoint_steps=0, log_steps=steps, save_losses=False)
    cfg["model"]["mixed_precision"] = mixed_precision
    cfg_path = folder / "fc_mnist_bench.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    md = folder / ("md_" + "_".join(a.strip("-") for a in launcher[1:]) + ("_mp" if mixed_precision else "_fp32"))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([*launcher, str(BIN / "python-pt"), str(FC_MNIST / "run.py"), "--mode", "train",
                           "--params", str(cfg_path), "-o", str(md)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(launcher)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return float(json.loads((md / "performance" / "performance.json").read_text())["samples_per_sec"])


def main() -> int:
    steps = int(os.environ.get("BENCH_STEPS", "1500"))
    params = int(os.environ.get("BENCH_CKPT_PARAMS", str(32_000_000)))
    repeat = int(os.environ.get("BENCH_REPEAT", "5"))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        folder = Path(tmp)
        rows = []
        places = [("disk", folder / "ck", False), ("disk", folder / "ck", True)]
        if Path("/dev/shm").is_dir():  # tmpfs: fsync is free, what is left is csrun's own work
            places.append(("tmpfs", Path(tempfile.mkdtemp(dir="/dev/shm")), False))
        for where, ck, fsync in places:
            ck.mkdir(exist_ok=True)
            ratio, ours, bare = bench_checkpoint(ck, params, repeat, fsync)
            base = "torch.save + fsync + torch.load" if fsync else "torch.save + torch.load"
            rows.append((f"checkpoint save+load, {params // 10**6} M params ({params * 8 / 2**20:.0f} MB), {where}",
                         f"{ours:.3f} s", f"{bare:.3f} s ({base})", f"{ratio:.2f}", "<= 1.3"))
            if where == "tmpfs":
                ck.rmdir()
        plain = plain_loop(steps)
        cpu = [str(BIN / "csrun_cpu"), "--alloc-node", "False"]
        one = [str(BIN / "csrun_wse"), "--total-nodes", "2", "--tasks-per-node", "1"]
        two = [str(BIN / "csrun_wse"), "--total-nodes", "3", "--tasks-per-node", "1"]
        for name, launcher, mixed in (
                ("fc_mnist csrun_cpu (eager, lone chief)", cpu, True),
                ("fc_mnist csrun_wse, 1 streamer, emulator float16 compute", one, True),
                ("fc_mnist csrun_wse, 2 streamers, emulator float16 compute", two, True),
                ("fc_mnist csrun_wse, 1 streamer, emulator float32 compute", one, False),
                ("fc_mnist csrun_wse, 2 streamers, emulator float32 compute", two, False)):
            rate = csrun_rate(launcher, folder, steps, mixed)
            rows.append((name, f"{rate:,.0f} samples/s", f"{plain:,.0f} samples/s (plain PyTorch loop)",
                         f"{rate / plain:.2f}", "-"))
    print(f"\n{steps} fc_mnist steps of batch 128; torch threads {torch.get_num_threads()}\n")
    print("| measurement | csrun | baseline | ratio | target |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
