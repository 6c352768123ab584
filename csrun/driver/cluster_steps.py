"""A training step on a cluster of N systems, as the chief's loop makes it: N batches, one per system.

The user's script does not change with N: its loop takes one batch per step and its model call
is recorded on it, as on one system. On a cluster the driver takes N consecutive batches of the
stream for each step (the loop sees the first; the per-system batch is the script's batch size
and the global batch N times it, as in the model zoo), and sends system i the program's inputs
taken from batch i the way the step took them from the first (:attr:`StepState.input_leaves`).

Refused, each in one line naming the fix: an input the step computed on the host from the
batch (each system would need the computation done on its own batch: do it in the model's
forward); batches of different shapes within a step. An epoch whose last batches do not fill a
step of N leaves them out (said once), as one system at N·B with ``drop_last`` leaves out the
samples that do not fill its last batch. A checkpoint taken at the step before them records the
next epoch's first batch as its data position (:func:`csrun.run.loops.next_step_start`; a loader of
unknown length records the batches taken, and the resumed run reads the left-out ones and leaves
them out again), so a run resumed from any checkpoint takes exactly the batches the uninterrupted
run takes.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from csrun.cluster import cluster_info
from csrun.driver.batch_dtypes import widened
from csrun.driver.step_values import StepState
from csrun.emulator.swarm.device import ClusterError, Shards, stop_cluster
from csrun.stream.source import EPOCH_END
from csrun.stream.wire import mpi


class ClusterSteps:
    """Gathers each step's N batches and turns them into the systems' shards."""

    def __init__(self, num_csx: int, notice: Callable[[str], None]) -> None:
        self.num_csx = num_csx
        self._notice = notice
        self._told_short_epoch = False

    def gather(self, fetch: Callable[[], Any]) -> list[Any] | None:
        """The step's other N-1 batches from ``fetch``; None when the epoch ends first (its last
        batches are left out, as one system at N·B with ``drop_last`` leaves out the samples that
        do not fill a batch; the loader's count of batches taken still counts them)."""
        extras: list[Any] = []
        for _ in range(self.num_csx - 1):
            item = fetch()
            if item is EPOCH_END:
                if not self._told_short_epoch:
                    self._told_short_epoch = True
                    self._notice(f"the epoch's last {len(extras) + 1} batch(es) do not fill a step of "
                                 f"{self.num_csx} systems: left out (as drop_last does for one system at "
                                 f"{self.num_csx} x batch_size)")
                return None
            extras.append(widened(item))
        return extras

    def shards(self, values: StepState, extras: list[Any]) -> Shards:
        """One input tuple per system: the step's own, then each other batch's taken alike."""
        first = values.inputs
        if any(index < 0 for index in values.input_leaves):
            k = values.input_leaves.index(-1)
            raise ClusterError(f"on a cluster of {self.num_csx} systems each system takes the step's inputs from "
                               f"its own batch, but input {k} ({_describe(first[k])}) was computed on the host from "
                               "the batch: compute it in the model's forward (or in the input pipeline)")
        shards: list[tuple[Any, ...]] = [first]
        for system, batch in enumerate(extras, start=2):
            leaves = pytree.tree_leaves(batch)
            taken = tuple(leaves[i] if i < len(leaves) else None for i in values.input_leaves)
            for k, (mine, want) in enumerate(zip(taken, first)):
                if not isinstance(mine, torch.Tensor) or mine.shape != want.shape or mine.dtype != want.dtype:
                    got = _describe(mine) if isinstance(mine, torch.Tensor) else type(mine).__name__
                    raise ClusterError(f"system {system}'s batch has input {k} {got}, system 1's "
                                       f"{_describe(want)}: every batch of a step must have the same shapes "
                                       "(drop_last=True for the DataLoader)")
            shards.append(taken)
        return Shards(tuple(shards))


def _describe(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"


_released = False


def release_cluster() -> None:
    """At the chief's exit: tell the cluster's systems and MemoryX to leave (once)."""
    global _released
    info = cluster_info()
    if _released or not info.swarm_tasks or not info.is_chief:
        return
    _released = True
    try:
        stop_cluster(mpi().COMM_WORLD, info.num_csx)
    except Exception:  # noqa: BLE001 - exiting anyway: the launcher ends tasks left behind
        pass
