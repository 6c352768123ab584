"""A task that leaves evidence: writes <out>/rank_<R>.json with who it is, then optionally fails.

Usage: task_probe.py OUT_DIR [--fail-rank R] [--sleep S]

Every task joins the MPI world when the job has more than one task, and records the sum of
an allreduce of 1 over COMM_WORLD (= the world size when all components share one world).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from csrun.cluster import cluster_info


def main() -> int:
    out = Path(sys.argv[1])
    args = sys.argv[2:]
    fail_rank = int(args[args.index("--fail-rank") + 1]) if "--fail-rank" in args else -1
    sleep = float(args[args.index("--sleep") + 1]) if "--sleep" in args else 0.0
    info = cluster_info()
    record = {
        "rank": info.rank, "num_tasks": info.num_tasks, "role": info.role, "node": info.node_name,
        "local_rank": info.local_rank, "launcher": info.launcher, "launch_mode": info.launch_mode,
        "env": {k: v for k, v in os.environ.items() if k.startswith("CSRUN_") or k in ("CS_IP", "SLURM_JOB_GRES", "SLURM_GPUS")},
    }
    if info.num_tasks > 1:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        record["mpi_rank"] = comm.Get_rank()
        record["mpi_size"] = comm.Get_size()
        record["allreduce"] = comm.allreduce(1)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank_{info.rank}.json").write_text(json.dumps(record))
    if info.rank == fail_rank:
        return 3
    time.sleep(sleep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
