"""What a task waiting in MPI_Init costs, with the arrival board (csrun.stream.arrivals) and without.

Command (from the repository root)::

    .venv/bin/python bench/stream/mpi_init.py [--rounds 3] [--late 2.0] [--steps 50]

Two measurements, the board on and off (``CSRUN_MPI_ARRIVALS``) in alternating rounds, local
mode (mpiexec):

1. ``mpiexec -n 3``: rank 0 sleeps ``--late`` seconds (a chief building its model), then every
   rank calls ``csrun.stream.wire.mpi()``; printed: the waiting ranks' CPU seconds per wall
   second inside that call (median over ranks 1-2 and the rounds);
2. the README's job shape, ``csrun_wse --total-nodes 3`` on fc_mnist for ``--steps`` steps
   (``OMP_NUM_THREADS=1``): the job's wall time, and its ratio on / off (median of rounds).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"

SCRIPT = """
import os, time
rank = int(os.environ["PMI_RANK"])
if rank == 0:
    time.sleep(float(os.environ["LATE"]))
from csrun.stream.wire import mpi
t, c = time.monotonic(), time.process_time()
mpi().COMM_WORLD.Barrier()
print(f"rank {rank} wall {time.monotonic() - t:.4f} cpu {time.process_time() - c:.4f}", flush=True)
"""


def waiting_cpu(board: str, late: float) -> float:
    """CPU s / wall s of ranks 1-2 inside mpi() while rank 0 comes ``late`` seconds after them (median)."""
    env = {**os.environ, "CSRUN_MPI_ARRIVALS": board, "LATE": str(late), "PYTHONPATH": str(REPO)}
    done = subprocess.run([str(BIN / "mpiexec"), "-n", "3", str(BIN / "python"), "-c", SCRIPT], env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    found = re.findall(r"rank (\d) wall ([\d.]+) cpu ([\d.]+)", done.stdout)
    return statistics.median(float(c) / float(w) for r, w, c in found if r != "0")


def job_wall(board: str, params: Path, model_dir: Path) -> float:
    """Wall seconds of ``csrun_wse --total-nodes 3`` training fc_mnist with ``params``."""
    env = {**os.environ, "CSRUN_MPI_ARRIVALS": board, "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    subprocess.run([str(BIN / "csrun_wse"), "--total-nodes", "3", str(BIN / "python-pt"),
                    str(REPO / "models" / "fc_mnist" / "run.py"), "--mode", "train", "--params", str(params),
                    "-o", str(model_dir)], env=env, capture_output=True, timeout=600, check=True)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--late", type=float, default=2.0, help="seconds rank 0 comes after the others")
    ap.add_argument("--steps", type=int, default=50, help="fc_mnist steps of the job")
    args = ap.parse_args()
    os.environ.pop("SLURM_CONF", None)  # local mode: the tasks share this machine's cores
    config = yaml.safe_load((REPO / "configs" / "fc_mnist.yaml").read_text())
    config["runconfig"]["max_steps"] = args.steps
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    wall: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        params = Path(tmp) / "fc_mnist.yaml"
        params.write_text(yaml.safe_dump(config))
        for r in range(args.rounds):
            for board in ("on", "off"):
                cpu[board].append(waiting_cpu(board, args.late))
                wall[board].append(job_wall(board, params, Path(tmp) / f"md_{r}_{board}"))
                print(f"round {r} board {board}: waiting CPU/wall {cpu[board][-1]:.3f}, job {wall[board][-1]:.2f} s",
                      file=sys.stderr, flush=True)
    ratio = statistics.median(a / b for a, b in zip(wall["on"], wall["off"]))
    print(f"\n{args.rounds} rounds, rank 0 {args.late:g} s late, fc_mnist {args.steps} steps, {os.cpu_count()} cores\n")
    print("| measurement | board on | board off | on / off |")
    print("|---|---|---|---|")
    print(f"| a rank waiting in MPI_Init, CPU s / wall s (median) | {statistics.median(cpu['on']):.3f} | "
          f"{statistics.median(cpu['off']):.3f} | |")
    print(f"| `csrun_wse --total-nodes 3` fc_mnist job, wall s (median) | {statistics.median(wall['on']):.2f} | "
          f"{statistics.median(wall['off']):.2f} | {ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
