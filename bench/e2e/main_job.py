"""The README's main job against the same config on the eager ``--cpu`` path.

Command (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/e2e/main_job.py [--rounds 3] [--steps N] [--gpu]

Runs ``models/fc_mnist/run.py --mode train --params configs/fc_mnist.yaml`` (the README's
main job; ``--steps`` overrides ``max_steps``, default the config's 2000) in these ways, in
alternating rounds, each into a fresh model_dir:

- ``--cpu``: ``python-pt run.py --cpu``, one eager PyTorch process — the baseline;
- ``csrun_wse --total-nodes 3``: the README command (chief + 2 streamers, embedded emulator,
  the config's mixed precision: float16 emulated by rounding on float32 kernels);
- ``csrun_wse --total-nodes 1``: the embedded emulator in one process, float16 by rounding;
  again with ``CSRUN_HALF_EMULATION=autocast`` (16-bit CPU kernels); and with
  ``mixed_precision: false`` (float32);
- the README command again, into a model_dir where ``--compile_only`` (the same command with the
  flag; untimed) compiled it first: the legacy two-step workflow, whose training run loads the
  compile from ``cs_<hash>/`` instead of capturing the step.

With ``--gpu`` (a machine with a GPU) the rows are instead: the baseline, the same config
trained by a plain eager PyTorch loop on the GPU (``bench/e2e/eager_on_gpu.py``: the model, the
loader and SGD of the config, float16 autocast); the README command with ``--emulator cuda`` (the
job's ``cs_emulator`` on the GPU, each step a CUDA graph replay:
:mod:`csrun.emulator.engine.cuda_graph`); the same with ``CSRUN_CUDA_GRAPH=off`` (every kernel
of the step launched one by one); and the ``--cpu`` path. The ratios are to the first row.

Prints one markdown table: the runner's own samples/s (``performance.json``; the emulator
path's figure includes the compile), its ratio to the ``--cpu`` run of the same round
(median over rounds), the same ratio with the compile and the program load taken out of the
emulator path's time (``compile_time`` + ``programming_time``), the job's CPU seconds per
wall second (all its processes) and the whole job's wall seconds (start-up included).
``csrun_wse`` runs in local mode (``mpiexec``) unless ``SLURM_CONF`` points at a cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
RUN = REPO / "models" / "fc_mnist" / "run.py"
PRECOMPILED = "`csrun_wse --total-nodes 3` after `--compile_only` into its model_dir (legacy two-step)"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_job(argv: list[str], env: dict[str, str], model_dir: Path, *,
            precompile: bool = False) -> tuple[float, float, float, float]:
    """Run one job; (samples/s from performance.json, the same without the compile and the program
    load, CPU s / wall s of all its processes, the whole job's wall seconds). ``precompile``: run
    the same command with ``--compile_only`` into ``model_dir`` first (not counted)."""
    if precompile:
        done = subprocess.run(argv + ["--compile_only", "-o", str(model_dir)], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} --compile_only failed ({done.returncode}):\n{done.stderr[-3000:]}")
    cpu0, t0 = _children_cpu(), time.monotonic()
    done = subprocess.run(argv + ["-o", str(model_dir)], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=1200)
    wall, cpu = time.monotonic() - t0, _children_cpu() - cpu0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    perf = json.loads((model_dir / "performance" / "performance.json").read_text())
    setup = float(perf.get("compile_time") or 0.0) + float(perf.get("programming_time") or 0.0)
    steady = perf["total_samples"] / max(perf["total_time"] - setup, 1e-9)
    return float(perf["samples_per_sec"]), steady, cpu / wall, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="max_steps (default: the config's)")
    ap.add_argument("--gpu", action="store_true", help="the README command on the GPU, graph on and off")
    args = ap.parse_args()
    config = yaml.safe_load((REPO / "configs" / "fc_mnist.yaml").read_text())
    if args.steps:
        config["runconfig"]["max_steps"] = args.steps
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.pop("CSRUN_HALF_EMULATION", None)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        mixed = folder / "fc_mnist.yaml"
        mixed.write_text(yaml.safe_dump(config))
        fp32_config = json.loads(json.dumps(config))
        fp32_config["model"]["mixed_precision"] = False
        fp32 = folder / "fc_mnist_fp32.yaml"
        fp32.write_text(yaml.safe_dump(fp32_config))
        job = [str(BIN / "python-pt"), str(RUN), "--mode", "train"]
        wse = str(BIN / "csrun_wse")
        rows: list[tuple[str, list[str], dict[str, str]]] = [
            ("`--cpu` path (eager PyTorch, one process)", job + ["--params", str(mixed), "--cpu"], env),
            ("`csrun_wse --total-nodes 3` (README main job, float16 by rounding)",
             [wse, "--total-nodes", "3"] + job + ["--params", str(mixed)], env),
            ("embedded, one process, float16 by rounding (default)",
             [wse, "--total-nodes", "1"] + job + ["--params", str(mixed)], env),
            ("embedded, one process, float16 by autocast",
             [wse, "--total-nodes", "1"] + job + ["--params", str(mixed)], {**env, "CSRUN_HALF_EMULATION": "autocast"}),
            ("embedded, one process, float32 (`mixed_precision: false`)",
             [wse, "--total-nodes", "1"] + job + ["--params", str(fp32)], env),
            ("`csrun_wse --total-nodes 3`, `CSRUN_GC_FREEZE=0` (the collector left alone)",
             [wse, "--total-nodes", "3"] + job + ["--params", str(mixed)], {**env, "CSRUN_GC_FREEZE": "0"}),
            ("`--cpu` path, `CSRUN_GC_FREEZE=0`", job + ["--params", str(mixed), "--cpu"],
             {**env, "CSRUN_GC_FREEZE": "0"}),
            (PRECOMPILED, [wse, "--total-nodes", "3"] + job + ["--params", str(mixed)], env),
        ]
        if args.gpu:
            on_gpu = [wse, "--total-nodes", "3", "--emulator", "cuda"] + job + ["--params", str(mixed)]
            eager = [str(BIN / "python"), str(REPO / "bench" / "e2e" / "eager_on_gpu.py"), "--params", str(mixed)]
            rows = [("eager PyTorch on the GPU (the same config, one process)", eager, env),
                    ("`csrun_wse --total-nodes 3 --emulator cuda` (a CUDA graph per step)", on_gpu, env),
                    ("the same, `CSRUN_CUDA_GRAPH=off`", on_gpu, {**env, "CSRUN_CUDA_GRAPH": "off"}), rows[0]]
        rates: dict[str, list[float]] = {name: [] for name, _, _ in rows}
        ratios: dict[str, list[float]] = {name: [] for name, _, _ in rows}
        cpus: dict[str, list[float]] = {name: [] for name, _, _ in rows}
        steady_ratios: dict[str, list[float]] = {name: [] for name, _, _ in rows}
        walls: dict[str, list[float]] = {name: [] for name, _, _ in rows}
        for r in range(args.rounds):
            base = 0.0
            for i, (name, argv, job_env) in enumerate(rows):
                rate, steady, cpu, wall = run_job(argv, job_env, folder / f"md_{r}_{i}",
                                                  precompile=name == PRECOMPILED)
                walls[name].append(wall)
                base = rate if i == 0 else base
                rates[name].append(rate)
                ratios[name].append(rate / base)
                steady_ratios[name].append(steady / base)
                cpus[name].append(cpu)
                print(f"round {r}: {name}: {rate:,.0f} samples/s, CPU/wall {cpu:.2f}", file=sys.stderr, flush=True)
    steps = config["runconfig"]["max_steps"]
    print(f"\nfc_mnist, configs/fc_mnist.yaml, {steps} steps of batch 128, {args.rounds} rounds "
          f"(OMP_NUM_THREADS={env['OMP_NUM_THREADS']}, {os.cpu_count()} cores)\n")
    baseline = "eager on the GPU" if args.gpu else "`--cpu`"
    print(f"| run | samples/s (median) | / {baseline} (median of rounds) | rounds | / {baseline} without compile + load "
          "| CPU s / wall s | whole job, wall s |")
    print("|---|---|---|---|---|---|---|")
    for name, _, _ in rows:
        each = ", ".join(f"{x:.2f}" for x in ratios[name])
        print(f"| {name} | {statistics.median(rates[name]):,.0f} | {statistics.median(ratios[name]):.2f} | "
              f"{each} | {statistics.median(steady_ratios[name]):.2f} | {statistics.median(cpus[name]):.2f} | "
              f"{statistics.median(walls[name]):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
