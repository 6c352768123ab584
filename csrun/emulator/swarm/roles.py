"""The two roles' halves of a data-parallel step (the package docstring has the messages).

:class:`MemoryXRole` holds the engine whose weights, optimizer, schedule and scaler are the
cluster's; :class:`SystemRole` holds an engine that runs the forward and backward of its shard
with the weights MemoryX broadcast. Both take the same program; one call of ``step`` on every
rank of the swarm is one training step.
"""

from __future__ import annotations

from typing import Any

import torch

from csrun.emulator.engine.executor import Engine
from csrun.emulator.swarm.swarmx import SwarmX
from csrun.program.errors import SpecError
from csrun.program.step_plan import FULL_STEP, StepPlan

HOLD = StepPlan(update=False)
"""A system's step: forward and backward, the gradients kept for SwarmX."""


def _check(engine: Engine) -> None:
    if not engine.training:
        raise SpecError("a data-parallel step trains: this is an eval program")


class MemoryXRole:
    """MemoryX: the cluster's weights and optimizer; the update of the summed gradients."""

    def __init__(self, engine: Engine, swarm: SwarmX) -> None:
        _check(engine)
        self.engine = engine
        self.swarm = swarm
        self._size = size = engine.flat_weights().numel()
        self._outgoing = torch.zeros(size + 1, dtype=torch.float32)  # the weights, then the loss scale
        self._total = torch.zeros(size + len(engine.params), dtype=torch.float32)  # gradients, then who had one

    def step(self, plan: StepPlan = FULL_STEP) -> dict[str, torch.Tensor]:
        """Broadcast the weights and the scale, sum the systems' gradients, update; the step's
        ``lr``, ``loss_scale``, ``global_step`` (and ``grad_norm`` with clipping)."""
        scaler = self.engine.scaler
        assert scaler is not None  # noqa: S101 - _check: a train engine
        self._outgoing[:-1].copy_(self.engine.flat_weights())
        self._outgoing[-1] = scaler.scale
        self.swarm.broadcast(self._outgoing)
        self.swarm.reduce(self._total)
        grads, present = self._total[:self._size], self._total[self._size:]
        return self.engine.apply_gradients(grads.div_(self.swarm.systems), plan, present=present)


class SystemRole:
    """A system: its shard's forward and backward with MemoryX's weights."""

    def __init__(self, engine: Engine, swarm: SwarmX) -> None:
        _check(engine)
        self.engine = engine
        self.swarm = swarm
        self._incoming = torch.zeros(engine.flat_weights().numel() + 1, dtype=torch.float32)
        self._size = engine.flat_weights().numel()
        self._grads = torch.zeros(self._size + len(engine.params), dtype=torch.float32)  # gradients, then who had one

    def step(self, shard: Any) -> dict[str, torch.Tensor]:
        """Take the weights and scale, run ``shard``'s forward and backward, hand the gradients to
        SwarmX; this shard's outputs (``loss`` first)."""
        self.swarm.broadcast(self._incoming)
        self.engine.load_flat_weights(self._incoming[:-1])
        self.engine.set_loss_scale(float(self._incoming[-1]))
        out = self.engine.run_step(shard, plan=HOLD)
        self._grads[:self._size].copy_(self.engine.flat_gradients())
        self._grads[self._size:].copy_(self.engine.gradient_mask())
        self.engine.clear_gradients()
        self.swarm.reduce(self._grads)
        return {k: v for k, v in out.items() if k not in ("lr", "loss_scale", "global_step")}
