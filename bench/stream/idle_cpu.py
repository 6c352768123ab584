"""What a waiting streamer costs: CPU seconds per second of wall time while it waits for credit.

Command (from the repository root)::

    .venv/bin/python bench/stream/idle_cpu.py [--batches 100] [--step-ms 20] [--rounds 3] [--baseline REPO]

Runs ``mpiexec -n 2``: a chief that takes one small batch every ``--step-ms`` ms (as if the
device's step took that long) and one streamer, whose ring is full almost all the time, so it
spends the run waiting for credit. The streamer writes its own CPU time (``os.times``) and wall
time when it exits; the table gives CPU s / wall s (target <= 0.05). ``--baseline REPO`` runs
the same job against another checkout of csrun (e.g. a ``git worktree`` of an older commit) in
alternating rounds, for the before/after figure.
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

JOB = r'''
import atexit, json, os, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
import csrun.torch as cbtorch

out, batches, step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
cbtorch.initialize(None)
loader = cbtorch.dataloader(DataLoader(TensorDataset(torch.arange(4096.0).reshape(-1, 1)), batch_size=4, drop_last=True))
start_wall, start = time.monotonic(), os.times()
if cbtorch.is_streamer():
    def report() -> None:
        t = os.times()
        with open(out, "w") as f:
            json.dump({"cpu": (t.user - start.user) + (t.system - start.system), "wall": time.monotonic() - start_wall}, f)
    atexit.register(report)
session = cbtorch.Session(loader, report=False)
with session:
    for i, batch in enumerate(loader):
        time.sleep(step_s)
        if i + 1 == batches:
            break
s = session.stats.streamers[0]
with open(out + ".waits", "w") as f:
    json.dump({"wait_cpu": getattr(s, "credit_wait_cpu_s", None), "wait": s.credit_wait_s}, f)
'''


def one(repo: str, batches: int, step_ms: float) -> tuple[float, float | None]:
    """(CPU s / wall s of the streamer's whole run, CPU s / wall s while it waited for credit)
    in one job run against ``repo`` (the second is None where the checkout does not count it)."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "job.py"
        script.write_text(JOB)
        out = Path(tmp) / "streamer.json"
        mpiexec = Path(sys.executable).parent / "mpiexec"
        env = {**os.environ, "PYTHONPATH": repo, "OMP_NUM_THREADS": "1"}
        for name in ("PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "CS_IP", "CSRUN_LAUNCHER"):
            env.pop(name, None)
        subprocess.run([str(mpiexec), "-n", "2", sys.executable, str(script), str(out), str(batches),
                        str(step_ms / 1000)], env=env, check=True, capture_output=True, timeout=600)
        data = json.loads(out.read_text())
        waits = json.loads(Path(str(out) + ".waits").read_text())
    per_wait = waits["wait_cpu"] / waits["wait"] if waits.get("wait") and waits.get("wait_cpu") is not None else None
    return data["cpu"] / data["wall"], per_wait


def main() -> None:
    """Run the rounds and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline", default=None, help="another csrun checkout to compare against")
    args = p.parse_args()
    here = str(Path(__file__).resolve().parents[2])
    now, before = [], []
    for _ in range(args.rounds):
        now.append(one(here, args.batches, args.step_ms))
        if args.baseline:
            before.append(one(args.baseline, args.batches, args.step_ms))
    def cells(runs: list[tuple[float, float | None]]) -> str:
        whole = [r[0] for r in runs]
        waits = [r[1] for r in runs if r[1] is not None]
        wait = f"{statistics.median(waits):.3f}" if waits else "(not counted)"
        return f"{wait} | {statistics.median(whole):.3f} ({', '.join(f'{w:.3f}' for w in whole)})"

    print(f"| streamer ({args.batches} batches, {args.step_ms:g} ms steps, {args.rounds} rounds) "
          "| CPU s / wall s while waiting for credit (median) | CPU s / wall s, whole run | target (waiting) |")
    print("|---|---|---|---|")
    print(f"| this checkout | {cells(now)} | <= 0.05 |")
    if before:
        print(f"| baseline {args.baseline} | {cells(before)} | - |")


if __name__ == "__main__":
    main()
