"""MemoryX's memory per parameter (RSS / parameter count) against the plan's estimate (issue 35).

Command (from the repository root)::

    .venv/bin/python bench/cluster/memoryx_memory.py [--sizes 10,50,100] [--optimizers adamw,sgd] [--steps 3]

For each size (millions of parameters) and optimizer, ``mpiexec -n 2`` runs
:class:`csrun.emulator.swarm.roles.MemoryXRole` on rank 0 and one
:class:`~csrun.emulator.swarm.roles.SystemRole` on rank 1 (a float32 program, as the swarm runs
them) for ``--steps`` steps of a stack of ``Linear(W, W)`` layers with ReLUs and a 10-way head
(W = 1024 up to 10M parameters, else 2048; batch 2, so activations are noise). Rank 0 reads its
resident set (``VmRSS`` of /proc/self/status) after the model and its export are made (the
baseline: a MemoryX task holds its program before it builds anything), after
:class:`~csrun.emulator.engine.executor.Engine`, after the role, after the first step and after
the last; ``VmHWM`` is the peak. Each growth over the baseline, divided by the trainable
parameter count, is set against the plan's estimate: :func:`csrun.compiler.streaming.memoryx_bytes`
of :func:`csrun.compiler.costs.layer_costs` (float32 master weights, the optimizer's float32 slots
(:func:`csrun.compiler.optim.state_slots`), one float32 gradient sum; 16-bit copies only with
mixed precision, which the swarm refuses) per parameter: 16 B for AdamW, 12 B for SGD with
momentum. The model and export's own growth over the interpreter after its imports is printed too
(``program``): the exported program's copy of the weights, which the estimate does not count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

JOB = r'''
import json, sys
import torch
import torch.nn.functional as F
from torch import nn
from mpi4py import MPI
from csrun.emulator.engine.executor import Engine
from csrun.emulator.swarm.roles import MemoryXRole, SystemRole
from csrun.emulator.swarm.swarmx import SwarmX
from csrun.program.spec import OptimizerSpec
from tests.emulator.helpers import make_program

OPTIMIZERS = {"sgd": OptimizerSpec(type="sgd", hyperparameters={"momentum": 0.9}),
              "adamw": OptimizerSpec(type="adamw", hyperparameters={"weight_decay": 0.01})}


def rss(field="VmRSS"):
    """This process's resident set (or its peak, VmHWM), bytes."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


class Wide(nn.Module):
    def __init__(self, width, depth, classes=10):
        super().__init__()
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, batch):
        x, y = batch
        return F.cross_entropy(self.head(self.body(x)), y)


out_path, millions, which, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
width = 1024 if millions <= 10 else 2048
depth = max(1, round(millions * 1e6 / (width * width + width)))
marks = {"imports": rss()}
torch.manual_seed(0)
with torch.no_grad():
    model = Wide(width, depth)
g = torch.Generator().manual_seed(1)
batches = [(torch.randn(2, width, generator=g), torch.randint(0, 10, (2,), generator=g)) for _ in range(2)]
program, spec = make_program(model, batches[0], optimizer=OPTIMIZERS[which], learning_rate=1e-4)
swarm = SwarmX(comm, memoryx=0)
comm.Barrier()
marks["program"] = rss()
if rank == 0:
    engine = Engine(program, spec, notice=lambda msg: None)
    marks["engine"] = rss()
    role = MemoryXRole(engine, swarm)
    marks["role"] = rss()
    for i in range(steps):
        role.step()
        if i == 0:
            marks["step 1"] = rss()
    marks[f"step {steps}"] = rss()
    marks["peak"] = rss("VmHWM")
    params = engine.flat_weights().numel()
    from csrun.compiler.costs import layer_costs
    from csrun.compiler.streaming import memoryx_bytes
    estimate = memoryx_bytes(layer_costs(program, spec), spec)
    json.dump({"params": params, "width": width, "depth": depth, "marks": marks, "estimate": estimate},
              open(out_path, "w"))
else:
    role = SystemRole(Engine(program, spec, notice=lambda msg: None), swarm)
    for i in range(steps):
        role.step(batches[i % 2])
'''

COLUMNS = ("engine", "role", "step 1", "last step", "peak")


def main() -> int:
    """Run the benchmark; print one row per size and optimizer."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,50,100", help="millions of parameters, comma-separated")
    parser.add_argument("--optimizers", default="adamw,sgd", help="adamw and/or sgd (momentum 0.9)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--mmap-threshold", type=int, default=None,
                        help="glibc's MALLOC_MMAP_THRESHOLD_ for the job: fixed, so every block above it is "
                             "mmapped and goes back to the system when freed (RSS = live memory)")
    args = parser.parse_args()
    mpiexec = Path(sys.executable).parent / "mpiexec"
    print("bytes per trainable parameter on the MemoryX rank: RSS growth over the baseline (model + export made)")
    print(f"{'optimizer':<9} {'params':>12} {'program':>8} " + " ".join(f"{c:>9}" for c in COLUMNS)
          + f" {'estimate':>9} {'last/est':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.py"
        job.write_text(JOB)
        for which in args.optimizers.split(","):
            for millions in (int(s) for s in args.sizes.split(",")):
                out = Path(tmp) / f"{which}-{millions}.json"
                subprocess.run([str(mpiexec), "-n", "2", sys.executable, str(job), str(out), str(millions), which,
                                str(args.steps)], check=True, cwd=REPO,
                               env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                                    "PATH": f"{mpiexec.parent}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
                                    **({"MALLOC_MMAP_THRESHOLD_": str(args.mmap_threshold)}
                                       if args.mmap_threshold is not None else {})})
                got = json.loads(out.read_text())
                marks, n = got["marks"], got["params"]
                base = marks["program"]
                per = {"engine": marks["engine"], "role": marks["role"], "step 1": marks["step 1"],
                       "last step": marks[f"step {args.steps}"], "peak": marks["peak"]}
                est = got["estimate"] / n
                cells = " ".join(f"{(v - base) / n:>9.2f}" for v in per.values())
                print(f"{which:<9} {n:>12,} {(base - marks['imports']) / n:>8.2f} {cells} {est:>9.2f} "
                      f"{(per['last step'] - base) / n / est:>9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
