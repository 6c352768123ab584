"""What the device's check against eager PyTorch costs (csrun.driver.verify).

Command (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/driver/verify_cost.py [--rounds 3] [--steps N]

Runs the README's main job in one process (``csrun_wse --total-nodes 1 python-pt
models/fc_mnist/run.py --mode train --params configs/fc_mnist.yaml``, the embedded emulator,
``--steps`` overrides ``max_steps``, default 2000) with ``--verify_steps 0`` (the check off:
the baseline), ``1`` (the default: the first step of the program), ``10``, and ``1`` with
``CSRUN_VERIFY_EVERY=100`` (a sampled check every 100 steps), in alternating rounds, each into a fresh model_dir, and the same for BERT debug (``models/bert/run.py``,
``configs/bert_debug.yaml``). Prints one markdown table: ``performance.json``'s samples/s
(median over rounds; the compile included), its ratio to the run without the check (median
of the rounds' ratios), and the seconds one check takes: measured inside the job (the state
fetched before the step, the device waited for, the state fetched after it, the eager step and
the comparison; ``CSRUN_BENCH_VERIFY_TIMES`` names a file the job appends each check's seconds
to, written by this benchmark's ``sitecustomize`` shim), median over the checks of the round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
MODELS = (("fc_mnist", "models/fc_mnist/run.py", "configs/fc_mnist.yaml"),
          ("BERT debug", "models/bert/run.py", "configs/bert_debug.yaml"))
CHECKS: tuple[tuple[int, int], ...] = ((0, 0), (1, 0), (10, 0), (1, 100))
"""(--verify_steps, CSRUN_VERIFY_EVERY) per configuration: off (the baseline), the default, ten, and the
default with one sampled check every 100 steps."""


SHIM = """
import os, time
path = os.environ.get("CSRUN_BENCH_VERIFY_TIMES")
if path:
    from csrun.driver import driver as _driver
    _start, _finish = _driver.DeviceDriver._start_check, _driver.StepCheck.finish
    _clock = {}
    def _timed_start(self, *a, **k):
        _clock["t0"] = time.perf_counter()
        return _start(self, *a, **k)
    def _timed_finish(self, *a, **k):
        try:
            return _finish(self, *a, **k)
        finally:
            with open(path, "a") as f:
                f.write(f"{time.perf_counter() - _clock['t0']}\\n")
    _driver.DeviceDriver._start_check = _timed_start
    _driver.StepCheck.finish = _timed_finish
"""
"""Loaded by the job's Python (a ``sitecustomize`` on its path): times each check."""


def run_job(argv: list[str], env: dict[str, str], model_dir: Path, times: Path) -> tuple[float, list[float]]:
    """One training job: (samples/s from performance.json, each check's seconds)."""
    times.write_text("")
    done = subprocess.run(argv + ["-o", str(model_dir)], env={**env, "CSRUN_BENCH_VERIFY_TIMES": str(times)},
                          cwd=REPO, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    perf = json.loads((model_dir / "performance" / "performance.json").read_text())
    return float(perf["samples_per_sec"]), [float(x) for x in times.read_text().split()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="max_steps (default: each config's)")
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.pop("CSRUN_VERIFY_STEPS", None)
    env.pop("CSRUN_VERIFY_EVERY", None)
    print(f"verify cost: {args.rounds} rounds, {os.cpu_count()} cores, OMP_NUM_THREADS={env['OMP_NUM_THREADS']}\n")
    print("| model | `--verify_steps` | every | samples/s (median) | / without the check (median of rounds) | rounds "
          "| checks | one check, s (median) |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shim = folder / "shim"
        shim.mkdir()
        (shim / "sitecustomize.py").write_text(SHIM)
        env["PYTHONPATH"] = os.pathsep.join([str(shim), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        for label, script, params in MODELS:
            config = yaml.safe_load((REPO / params).read_text())
            if args.steps:
                config["runconfig"]["max_steps"] = args.steps
            config_file = folder / f"{Path(params).stem}.yaml"
            config_file.write_text(yaml.safe_dump(config))
            job = [str(BIN / "csrun_wse"), "--total-nodes", "1", str(BIN / "python-pt"), str(REPO / script),
                   "--mode", "train", "--params", str(config_file)]
            rates: dict[tuple[int, int], list[float]] = {c: [] for c in CHECKS}
            ratios: dict[tuple[int, int], list[float]] = {c: [] for c in CHECKS}
            checks: dict[tuple[int, int], list[float]] = {c: [] for c in CHECKS}
            counts: dict[tuple[int, int], int] = {}
            for r in range(args.rounds):
                base_rate = 0.0
                for c in CHECKS:
                    n, every = c
                    rate, seconds = run_job(job + ["--verify_steps", str(n)], {**env, "CSRUN_VERIFY_EVERY": str(every)},
                                            folder / f"{label}_{r}_{n}_{every}", folder / "times.txt")
                    if c == CHECKS[0]:
                        base_rate = rate
                    rates[c].append(rate)
                    ratios[c].append(rate / base_rate)
                    checks[c].extend(seconds)
                    counts[c] = len(seconds)
                    print(f"{label} round {r}: --verify_steps {n}, every {every}: {rate:,.0f} samples/s, "
                          f"{len(seconds)} checks", file=sys.stderr, flush=True)
            for c in CHECKS:
                each = ", ".join(f"{x:.3f}" for x in ratios[c])
                per = f"{statistics.median(checks[c]):.3f}" if checks[c] else "-"
                print(f"| {label} | {c[0]} | {c[1] or '-'} | {statistics.median(rates[c]):,.0f} | "
                      f"{statistics.median(ratios[c]):.3f} | {each} | {counts.get(c, 0)} | {per} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
