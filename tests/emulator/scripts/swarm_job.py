"""N systems + MemoryX under mpiexec (rank 0: MemoryX) against one engine at batch N·B.

``python swarm_job.py OUT.json OPTIMIZER`` under ``mpiexec -n N+1``: 100 steps of the default
MLP at per-system batch B = 8, with clipping (max norm 1.0) and dynamic loss scaling; at step 37
one system's shard holds an infinity (an overflow on one system). Rank 0 then trains one engine
on the same global batches (N·B) and writes both runs' losses and final weights' largest
relative difference to OUT.json.
"""

import json
import math
import sys

import torch
from mpi4py import MPI

from csrun.emulator.engine.executor import Engine
from csrun.emulator.swarm.roles import MemoryXRole, SystemRole
from csrun.emulator.swarm.swarmx import SwarmX
from csrun.program.spec import LossScalingSpec, OptimizerSpec
from tests.emulator.helpers import make_program
from tests.tiny_models import MLP, mlp_batches

STEPS, B, OVERFLOW_AT = 100, 8, 37
OPTIMIZERS = {"sgd": OptimizerSpec(type="sgd", hyperparameters={"momentum": 0.9}),
              "adamw": OptimizerSpec(type="adamw", hyperparameters={"weight_decay": 0.01})}

out_path, which = sys.argv[1], sys.argv[2]
comm = MPI.COMM_WORLD
rank, n = comm.Get_rank(), comm.Get_size() - 1
torch.manual_seed(0)
model = MLP()
spec_kw = dict(optimizer=OPTIMIZERS[which], learning_rate=0.05, max_gradient_norm=1.0,
               loss_scaling=LossScalingSpec(factor="dynamic", initial_loss_scale=2.0 ** 10, steps_per_increase=20))
batches = mlp_batches(STEPS, seed=3, bs=n * B)
x, y = batches[OVERFLOW_AT]
x = x.clone()
x[-1, 0] = math.inf  # in the last system's shard
batches[OVERFLOW_AT] = (x, y)
program, spec = make_program(model, (batches[0][0][:B], batches[0][1][:B]), **spec_kw)
swarm = SwarmX(comm, memoryx=0)
losses = []
if rank == 0:
    memoryx = MemoryXRole(Engine(program, spec), swarm)
    scales = []
    for step in range(STEPS):
        values = memoryx.step()
        shard_losses = comm.gather(None, root=0)[1:]
        losses.append(sum(shard_losses) / n)
        scales.append(float(values["loss_scale"]))
    reference = Engine(*make_program(model, batches[0], **spec_kw))
    ref_losses, ref_scales = [], []
    for batch in batches:
        out = reference.run_step(batch)
        ref_losses.append(float(out["loss"]))
        ref_scales.append(float(out["loss_scale"]))
    mine, theirs = memoryx.engine.flat_weights(), reference.flat_weights()
    finite = [i for i, v in enumerate(ref_losses) if math.isfinite(v)]
    json.dump({
        "steps": STEPS, "systems": n,
        "loss_rel": max(abs(losses[i] - ref_losses[i]) / max(abs(ref_losses[i]), 1e-12) for i in finite),
        "weights_rel": float(((mine - theirs).abs().max() / theirs.abs().max()).item()),
        "scales": scales, "ref_scales": ref_scales,
        "global_step": memoryx.engine.step, "ref_global_step": reference.step,
    }, open(out_path, "w"))
else:
    system = SystemRole(Engine(program, spec), swarm)
    lo, hi = (rank - 1) * B, rank * B
    for step in range(STEPS):
        x, y = batches[step]
        out = system.step((x[lo:hi], y[lo:hi]))
        comm.gather(float(out["loss"]), root=0)
