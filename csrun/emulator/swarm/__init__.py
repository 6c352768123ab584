"""The Wafer-Scale Cluster's data-parallel step: N systems, MemoryX and SwarmX on MPI.

Seed 003's cluster trains one model on N systems data parallel: **MemoryX** keeps the float32
weights, the optimizer state, the schedule and the loss scaler, and runs the update; **SwarmX**
broadcasts the weights to every system and sums the systems' weight gradients back into MemoryX;
each **system** runs the program's forward and backward on its own shard of the global batch.
Here SwarmX is MPI's ``Bcast`` and ``Reduce`` on the swarm's communicator (:mod:`.swarmx`);
:mod:`.roles` holds the two roles' halves of a step, each on an
:class:`~csrun.emulator.engine.executor.Engine`.

One step's messages (swarm communicator: MemoryX and the N systems):

1. MemoryX -> every system, ``Bcast``: the weights and the loss scale (one float32 vector);
2. each system: forward and backward of its shard (batch size B) at that scale;
3. every system -> MemoryX, ``Reduce(SUM)``: the weight gradients, then one flag per weight
   saying whether the system's step reached it (MemoryX adds zeros; a weight no system reached
   gets no gradient, which the optimizer skips, as on one system);
4. MemoryX: the sum over N (the mean over the global batch N·B), unscale and overflow check (an
   overflow on any system is an inf in the sum: the step is skipped on all and the scale moves
   once), clipping, the optimizer with the schedule's rate, the scaler's update.

N systems at per-system batch B then train as one system at batch N·B, to float32 rounding
(the gradients of a mean are summed in another order). With mixed precision each system's
gradients are rounded to the 16-bit format before the sum (one system rounds the whole batch's
once), so the two agree to that rounding, not to float32's.

The chief's side (:mod:`.device`, :mod:`.link`) and the tasks' (:mod:`.task`) make these steps
from the user's loop: ARCHITECTURE.md has one step's messages end to end.
"""
