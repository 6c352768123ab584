"""The Wafer-Scale Cluster's samples/s with N = 1, 2, 4 systems on a step of fixed cost (issue 35).

Command (from the repository root)::

    .venv/bin/python bench/cluster/scaling.py [--systems 1,2,4] [--steps 30] [--warmup 5] [--rounds 3]
                                              [--pad-ms 100] [--batch 16] [--d-in 12 --hidden 24]
                                              [--baseline REPO]

For each N, ``mpiexec -n N+1`` runs :class:`csrun.emulator.swarm.roles.MemoryXRole` on rank 0 and
:class:`~csrun.emulator.swarm.roles.SystemRole` on ranks 1..N, as tests/emulator/scripts/swarm_job.py
does: tests/tiny_models.py's MLP, AdamW, per-system batch B (``--batch``). Each system's forward
and backward is padded to a fixed wall time (``--pad-ms``: the engine's ``run_step`` sleeps until
that long after it began), so a step costs the same on every system and two cores do not cap the
scaling: what is left to measure is SwarmX and MemoryX. After ``--warmup`` steps, rank 0 times
``--steps`` steps; the global samples/s is N·B per step. Prints per N the median over
``--rounds`` runs of samples/s, its ratio to N times N = 1's (the issue's bar: >= 0.9), the wall
seconds per step, and the CPU seconds per step (``os.times``, user + system) of the MemoryX rank
and of the systems (mean per system, and all N together): the collectives are blocking MPI calls
and MPICH polls in them, so a rank that waits (MemoryX through the systems' padded step, a system
through MemoryX's update) burns a core while it does. ``--baseline REPO`` runs each N on another
checkout too (e.g. ``git archive HEAD | tar -x -C /tmp/base``), alternately with this one, and
prints its table after this one's. ``--d-in`` / ``--hidden`` make the MLP bigger (more to
broadcast, reduce and update per step).
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

REPO = Path(__file__).resolve().parents[2]

JOB = r'''
import json, os, sys, time
import torch
from mpi4py import MPI
from csrun.emulator.engine.executor import Engine
from csrun.emulator.swarm.roles import MemoryXRole, SystemRole
from csrun.emulator.swarm.swarmx import SwarmX
from csrun.program.spec import OptimizerSpec
from tests.emulator.helpers import make_program
from tests.tiny_models import MLP

out_path, B, warmup, steps, pad = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
d_in, hidden = int(sys.argv[6]), int(sys.argv[7])
comm = MPI.COMM_WORLD
rank, n = comm.Get_rank(), comm.Get_size() - 1
torch.manual_seed(0)
model = MLP(d_in, hidden)
g = torch.Generator().manual_seed(3)
batches = [(torch.randn(n * B, d_in, generator=g), torch.randint(0, 5, (n * B,), generator=g)) for _ in range(8)]
program, spec = make_program(model, (batches[0][0][:B], batches[0][1][:B]), learning_rate=0.01,
                             optimizer=OptimizerSpec(type="adamw", hyperparameters={"weight_decay": 0.01}))
swarm = SwarmX(comm, memoryx=0)
if rank == 0:
    role = MemoryXRole(Engine(program, spec, notice=lambda msg: None), swarm)
    def step(i):
        role.step()
else:
    role = SystemRole(Engine(program, spec, notice=lambda msg: None), swarm)
    run_step = role.engine.run_step
    def padded(shard, *args, **kwargs):  # the forward and backward, padded to a fixed wall time
        t0 = time.perf_counter()
        out = run_step(shard, *args, **kwargs)
        left = pad - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)
        return out
    role.engine.run_step = padded
    lo, hi = (rank - 1) * B, rank * B
    def step(i):
        x, y = batches[i % len(batches)]
        role.step((x[lo:hi], y[lo:hi]))
for i in range(warmup):
    step(i)
comm.Barrier()
c0, t0 = os.times(), time.perf_counter()
for i in range(steps):
    step(warmup + i)
wall = time.perf_counter() - t0  # rank 0: its last update is after every system's last reduce
c1 = os.times()
cpu = (c1.user - c0.user) + (c1.system - c0.system)
cpus = comm.gather(cpu, root=0)
if rank == 0:
    json.dump({"wall": wall, "steps": steps, "cpu": cpus}, open(out_path, "w"))
'''


def run_one(mpiexec: Path, job: Path, out: Path, systems: int, args: argparse.Namespace, repo: Path) -> dict:
    """One ``mpiexec -n systems+1`` run of the job on the checkout ``repo``; its JSON."""
    subprocess.run([str(mpiexec), "-n", str(systems + 1), sys.executable, str(job), str(out), str(args.batch),
                    str(args.warmup), str(args.steps), str(args.pad_ms / 1000), str(args.d_in), str(args.hidden)],
                   check=True, cwd=repo, env={"PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1",
                                              "PATH": f"{mpiexec.parent}:/usr/bin:/bin",
                                              "HOME": os.environ.get("HOME", "/tmp")})
    return json.loads(out.read_text())


def table(runs: dict[int, list[dict]], args: argparse.Namespace) -> None:
    """One checkout's rows: medians over its rounds, ratios against its own N = 1."""
    def rate(got: dict, n: int) -> float:
        return n * args.batch * got["steps"] / got["wall"]

    base = statistics.median(rate(g, 1) for g in runs[1])
    print(f"{'N':>2} {'ranks':>5} {'samples/s':>10} {'/ N·(N=1)':>10} {'rounds':>20} {'wall s/step':>12} "
          f"{'MemoryX CPU s/step':>19} {'system CPU s/step':>18} {'all systems':>12}")
    for n, got in runs.items():
        rates = [rate(g, n) for g in got]
        med = statistics.median(rates)
        wall = statistics.median(g["wall"] / g["steps"] for g in got)
        mx = statistics.median(g["cpu"][0] / g["steps"] for g in got)
        sy = statistics.median(sum(g["cpu"][1:]) / n / g["steps"] for g in got)
        each = ", ".join(f"{x / (n * base):.2f}" for x in rates)
        print(f"{n:>2} {n + 1:>5} {med:>10.1f} {med / (n * base):>10.3f} {each:>20} {wall:>12.4f} "
              f"{mx:>19.4f} {sy:>18.4f} {sy * n:>12.4f}")


def main() -> int:
    """Run the benchmark; print one table per checkout, one row per N."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default="1,2,4", help="comma-separated N (N = 1 is run too, for the ratio)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="runs per N (rounds cycle through the N)")
    parser.add_argument("--pad-ms", type=float, default=100.0, help="a system's forward + backward, padded to this")
    parser.add_argument("--batch", type=int, default=16, help="per-system batch B")
    parser.add_argument("--d-in", type=int, default=12, help="the MLP's inputs (tests/tiny_models.py's default: 12)")
    parser.add_argument("--hidden", type=int, default=24, help="the MLP's hidden width (default 24)")
    parser.add_argument("--baseline", default=None, help="another csrun checkout, run alternately with this one")
    args = parser.parse_args()
    systems = sorted({1, *(int(s) for s in args.systems.split(","))})
    mpiexec = Path(sys.executable).parent / "mpiexec"
    checkouts = {"this checkout": REPO, **({f"baseline {args.baseline}": Path(args.baseline)} if args.baseline else {})}
    runs: dict[str, dict[int, list[dict]]] = {c: {n: [] for n in systems} for c in checkouts}
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.py"
        job.write_text(JOB)
        for r in range(args.rounds):
            for n in systems:
                for i, (label, repo) in enumerate(checkouts.items()):
                    got = run_one(mpiexec, job, Path(tmp) / f"{i}-{n}-{r}.json", n, args, repo)
                    runs[label][n].append(got)
                    print(f"  round {r + 1} N={n} {label}: {n * args.batch * got['steps'] / got['wall']:.1f} samples/s",
                          flush=True)
    print(f"\nMLP({args.d_in}, {args.hidden}, 5), B = {args.batch} per system, forward + backward padded to "
          f"{args.pad_ms:.0f} ms, {args.steps} timed steps, median of {args.rounds} runs")
    for label in checkouts:
        print(f"\n{label}:")
        table(runs[label], args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
