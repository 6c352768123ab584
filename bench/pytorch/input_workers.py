"""What a 2.x job's streamers cost when they are input workers, against running the script's flow.

Command (from the repository root)::

    .venv/bin/python bench/pytorch/input_workers.py [--rounds 3] [--setup-s 2.0] [--steps 40]

Runs ``csrun_wse --total-nodes 3`` (a chief and two streamers, locally under mpiexec) on a
small 2.x script whose chief spends ``--setup-s`` seconds of CPU on its setup before the loop
(building and initialising a model, as a zoo run's registry imports and model build do), then
trains ``--steps`` steps. Two variants, in alternating rounds:

- ``input worker``: the input function lives in an importable module; the streamers wait for
  the chief's assignment (polling with back-off) and run only the input function
  (:mod:`csrun.pytorch.input_worker`);
- ``script``: the same input function defined in the script itself, so the streamers run the
  script's flow up to the loop (its setup too) before they stream (the fallback, and what every
  2.x job did before).

Each streamer writes its CPU seconds (``os.times``) at exit. The table gives the job's wall
seconds and the streamers' mean CPU seconds per variant (medians over rounds) and the ratio
input worker / script. On this 2-core machine the script variant's streamers also take CPU from
the chief while it sets up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

DATA = r'''
import torch
def input_fn(samples):
    ds = torch.utils.data.TensorDataset(torch.randn(samples, 32), torch.randint(0, 4, (samples,)))
    return torch.utils.data.DataLoader(ds, batch_size=8, drop_last=True)
'''

JOB = r'''
import atexit, os, sys, time, json
out, setup_s, steps, variant = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rank = os.environ.get("PMI_RANK", "0")
def report():  # the whole process's CPU seconds (a streamer that is an input worker never returns from the import)
    t = os.times()
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"cpu": t.user + t.system}, f)
atexit.register(report)
import torch
import csrun.pytorch as cstorch
if variant == "script":
    def input_fn(samples):  # in the script: the streamers must run the script to build it
        ds = torch.utils.data.TensorDataset(torch.randn(samples, 32), torch.randint(0, 4, (samples,)))
        return torch.utils.data.DataLoader(ds, batch_size=8, drop_last=True)
else:
    from benchdata import input_fn
torch.manual_seed(0)
backend = cstorch.backend("CSX")
begin = time.process_time()
with backend.device:
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    w = torch.randn(256, 256)
    while time.process_time() - begin < setup_s:  # the setup's CPU work (a big model's init, imports)
        w = torch.tanh(w @ w.T / 256)
compiled = cstorch.compile(model, backend)
opt = cstorch.optim.SGD(model.parameters(), lr=0.01)
@cstorch.trace
def step(x, y):
    loss = torch.nn.functional.cross_entropy(compiled(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    return loss
for x, y in cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(input_fn, 1024), num_steps=steps):
    step(x, y)
'''


def one(work: Path, variant: str, setup_s: float, steps: int, env: dict[str, str]) -> tuple[float, float]:
    """(job wall seconds, the streamers' mean CPU seconds) of one run."""
    out = work / f"{variant}-{time.monotonic_ns()}"
    start = time.monotonic()
    done = subprocess.run([str(ROOT / "bin" / "csrun_wse"), "--total-nodes", "3", sys.executable, str(work / "job.py"),
                           str(out), str(setup_s), str(steps), variant], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"{variant} run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    cpus = [json.loads(Path(f"{out}.{rank}").read_text())["cpu"] for rank in (1, 2)]
    return wall, statistics.mean(cpus)


def main() -> int:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--setup-s", type=float, default=2.0)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="csrun-input-workers-"))
    (work / "benchdata.py").write_text(DATA)
    (work / "job.py").write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env["PYTHONPATH"] = os.pathsep.join([str(work), str(ROOT)])
    results: dict[str, list[tuple[float, float]]] = {"input": [], "script": []}
    for _ in range(args.rounds):
        for variant in ("input", "script"):
            results[variant].append(one(work, variant, args.setup_s, args.steps, env))
    med = {v: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for v, r in results.items()}
    print(f"chief setup {args.setup_s:g} CPU s, {args.steps} steps, {args.rounds} rounds (medians)")
    print("| streamers | job wall s | streamer CPU s (mean of 2) |")
    print("|---|---|---|")
    print(f"| input workers | {med['input'][0]:.2f} | {med['input'][1]:.2f} |")
    print(f"| run the script | {med['script'][0]:.2f} | {med['script'][1]:.2f} |")
    print(f"| ratio input / script | {med['input'][0] / med['script'][0]:.2f} | "
          f"{med['input'][1] / med['script'][1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
