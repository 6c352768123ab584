"""The chief's and the streamers' command in a ``csrun_wse --num-csx N`` test job: leave evidence.

Usage: cluster_probe.py OUT_DIR

Every task that runs it (the chief and the streamers: the task wrapper runs the swarm task on the
systems and MemoryX instead) joins MPI and writes ``OUT_DIR/rank_<R>.json``: who
:mod:`csrun.cluster` says it is, its node, the MPI world's size and the cluster's ``CSRUN_*``
variables. The chief then tells the systems and MemoryX to leave (the ``stop`` frame, as a
training chief does at its exit), so that the job ends. It joins no collective over the world:
the swarm tasks take part in none.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from csrun.cluster import cluster_info


def main() -> int:
    out = Path(sys.argv[1])
    info = cluster_info()
    from csrun.stream.wire import mpi  # as csrun's tasks join MPI: asleep until this node's peers come (MPICH spins)

    world = mpi().COMM_WORLD
    record = {
        "rank": info.rank, "mpi_rank": world.Get_rank(), "mpi_size": world.Get_size(), "role": info.role,
        "node": info.node_name, "num_csx": info.num_csx, "input_tasks": info.input_tasks,
        "streaming_rank": info.streaming_rank,
        "env": {k: v for k, v in os.environ.items() if k.startswith("CSRUN_") or k == "CS_IP"},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank_{info.rank}.json").write_text(json.dumps(record))
    if info.is_chief and info.swarm_tasks:
        from csrun.emulator.swarm.device import stop_cluster

        stop_cluster(world, info.num_csx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
