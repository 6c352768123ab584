"""The chief and the streamers of a job that is stopped by a signal (tests/launch/stopping.py): a run.py in small.

Usage (under csrun_wse, as ``python-pt stop_task.py OUT_DIR``): every task joins MPI. The
chief counts steps (one every 50 ms) inside the runner's own :class:`~csrun.run.preemption.Preemption`
until a stop is asked; then, as a training chief saves its checkpoint from MemoryX's state, it
asks every system and MemoryX of a cluster (``--num-csx N``) for an answer over the real link
(a program they refuse, in one ``error`` frame: each must still be serving), writes
``OUT_DIR/saved.json`` (the step reached, the signal, the ranks that answered), releases the
streamers and the cluster, announces its planned stop (:func:`csrun.run.preemption.announce_stop`)
and exits ``128 + signal``, under mpi4py's runner as a real chief. The streamers ignore the stop
signals (:func:`~csrun.run.preemption.ignore_on_streamer`) and wait for the chief's word. Each task
prints ``rank N ready`` once its handlers are in place (the chief: once every system answered
too). Without a stop the chief gives up after 2 minutes and exits 0. ``STOP_TASK_SAVE_S``: how
many seconds the save takes (default 0; a large model's checkpoint takes a while).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from csrun.cluster import cluster_info
from csrun.run.preemption import Preempted, Preemption, announce_stop, ignore_on_streamer
from csrun.stream.wire import mpi
from csrun.task_exits import install_last_word

STOP_TAG = 7999
STEP_S = 0.05


def swarm_answers(world, ranks: list[int]) -> list[int]:  # type: ignore[no-untyped-def]
    """The swarm ranks that answered a program they must refuse (an ``error`` frame each)."""
    if not ranks:
        return []
    import torch

    from csrun.emulator.swarm.link import chief_link

    answered = []
    for rank in ranks:
        link = chief_link(world, rank)
        link.send({"op": "load", "spec": "not a spec"}, [torch.zeros(1, dtype=torch.uint8)])
        header, _ = link.receive()
        if header.get("op") == "error":
            answered.append(rank)
    return answered


def chief(world, out: Path) -> int:  # type: ignore[no-untyped-def]
    info = cluster_info()
    swarm = list(range(1, info.num_csx + 2)) if info.swarm_tasks else []
    with Preemption() as preemption:
        preemption.stops_at_steps = True
        if swarm_answers(world, swarm) != swarm:
            return 3
        print("rank 0 ready", flush=True)
        step = 0
        deadline = time.monotonic() + 120
        while not preemption.requested and time.monotonic() < deadline:
            time.sleep(STEP_S)
            step += 1
    for rank in info.streamer_ranks:
        world.Send([bytearray(1), mpi().BYTE], dest=rank, tag=STOP_TAG)
    if preemption.signum is None:
        return 0
    answered = swarm_answers(world, swarm)  # the state a checkpoint is made of: MemoryX must still serve
    time.sleep(float(os.environ.get("STOP_TASK_SAVE_S", "0")))
    out.mkdir(parents=True, exist_ok=True)
    (out / "saved.json").write_text(json.dumps({"step": step, "signal": preemption.signum, "answered": answered}))
    if swarm:
        from csrun.emulator.swarm.device import stop_cluster

        stop_cluster(world, info.num_csx)
    stopped = Preempted(preemption.signum, step)
    print(f"{stopped}; checkpoint saved", flush=True)
    announce_stop(stopped)
    return stopped.exit_code


def streamer(world, rank: int) -> int:  # type: ignore[no-untyped-def]
    ignore_on_streamer()
    print(f"rank {rank} ready", flush=True)
    while not world.Iprobe(source=0, tag=STOP_TAG):
        time.sleep(STEP_S)
    world.Recv([bytearray(1), mpi().BYTE], source=0, tag=STOP_TAG)
    return 0


def main() -> int:
    info = cluster_info()
    install_last_word(info.rank, info.node_name)  # as csrun.torch does for a real chief
    world = mpi().COMM_WORLD
    return chief(world, Path(sys.argv[1])) if info.is_chief else streamer(world, info.rank)


if __name__ == "__main__":
    sys.exit(main())
