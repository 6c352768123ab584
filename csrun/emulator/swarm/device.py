"""The chief's device for a cluster of N systems: the step's N shards to the systems, the
update by MemoryX, the global step's values back.

:func:`cluster_device` is an :class:`~csrun.emulator.embedded.EmbeddedDevice` (its worker thread,
queue depth, failure rules and state calls) whose engine is a :class:`SwarmEngine`: a stand-in
that forwards each call to the cluster's tasks (:mod:`csrun.emulator.swarm.task`) over the
link (:mod:`csrun.emulator.swarm.link`) and waits for their answers.

One step, as the chief sees it (``submit`` with :class:`Shards`, one per system):

1. to system i (world rank i): its shard; to MemoryX (rank N+1): the step's plan;
2. (the systems and MemoryX run the step: the messages of :mod:`csrun.emulator.swarm`);
3. from each system: its shard's outputs; from MemoryX: ``lr``, ``loss_scale``, ``global_step``
   (and ``grad_norm``).

The step's outputs are the global batch's: a floating-point scalar (the loss) is the mean over
the systems, which is the mean over the global batch since the shards are the same size (a
float that is a sum, such as a count kept as a float, comes back as the systems' mean too); an
integer or boolean scalar is their sum (a count); a tensor whose first dimension is the shard's
batch is the systems' concatenated along it (in system order); any other output is refused at
the step, naming it. MemoryX divides the summed gradients by N, as the model zoo divides each
system's loss by ``num_csx``: for a loss that is a mean over its batch that is one system's
gradient at N·B. A program whose step updates buffers (BatchNorm's running statistics) is
refused: each system would keep its own. Every training step the cluster
runs is a whole one (backward, update, fresh gradients); eval programs run on one system, as
on the original cluster, and are refused here with its message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from csrun.emulator.embedded import EmbeddedDevice
from csrun.emulator.remote import wire
from csrun.emulator.swarm.link import MpiLink, chief_link
from csrun.errors import UserError
from csrun.program import archive
from csrun.program.errors import DeviceError, SpecError
from csrun.program.spec import ProgramSpec
from csrun.program.step_plan import FULL_STEP, StepPlan
from csrun.stream.wire import Backoff

EVAL_REFUSED = ("eval runs on one system: the cluster of {n} systems trains only (as on the Wafer-Scale "
                "Cluster); run eval with one system (csrun_wse without --num-csx, num_csx: 1)")
"""The refusal of an eval program on a cluster."""


class ClusterError(UserError):
    """Something a cluster of systems cannot run (an eval program, a step that is not whole)."""


@dataclass(frozen=True)
class Shards:
    """One step's inputs on a cluster: one input tuple per system, in system order."""

    shards: tuple[Any, ...]


def reduce_outputs(outputs: list[dict[str, torch.Tensor]], batch_size: int | None) -> dict[str, torch.Tensor]:
    """The global step's outputs from the systems' (see the module docstring for the rule);
    ``batch_size``: a shard's samples (None: the step has no batch-leading input)."""
    merged: dict[str, torch.Tensor] = {}
    for name in outputs[0]:
        values = [out[name] for out in outputs]
        first = values[0]
        if first.dim() == 0:
            stacked = torch.stack(values)
            merged[name] = stacked.mean(0) if first.is_floating_point() or first.is_complex() else stacked.sum(0)
        elif batch_size is not None and first.shape[0] == batch_size:
            merged[name] = torch.cat(values)
        else:
            raise ClusterError(f"the step's output {name!r} of shape {tuple(first.shape)} is neither a scalar nor one "
                               f"row per sample (a shard has {batch_size} samples): the systems' values cannot be "
                               "combined into the global step's; return it per sample, or as a scalar")
    return merged


_RUNNING_STATS = {"batch_norm": 5, "instance_norm": 5}
"""Ops that update running statistics in place when their argument at this index (training /
use_input_stats) is true, whatever their schema says."""


def mutated_buffers(program: torch.export.ExportedProgram) -> list[str]:
    """The buffers a step of ``program`` changes: those the signature lists, those a mutating op
    writes, and BatchNorm's / InstanceNorm's running statistics in training mode."""
    signature = program.graph_signature
    buffers = dict(signature.inputs_to_buffers)
    found = set(signature.buffers_to_mutate.values())
    for node in program.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        flag = _RUNNING_STATS.get(target._schema.name.removeprefix("aten::"))
        written = flag is not None and len(node.args) > flag and node.args[flag] is True
        for arg, schema_arg in zip(node.args, target._schema.arguments):
            alias = schema_arg.alias_info
            if isinstance(arg, torch.fx.Node) and arg.name in buffers and (written or (alias is not None
                                                                                     and alias.is_write)):
                found.add(buffers[arg.name])
    return sorted(found)


def _batch_size(shard: Any) -> int | None:
    """A shard's samples: the first dimension of its first input with dimensions (None: no such input)."""
    for leaf in pytree.tree_leaves(shard):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return None


class SwarmEngine:
    """The chief's stand-in for the cluster's engines (the ``Engine`` calls a device makes)."""

    def __init__(self, program: torch.export.ExportedProgram, spec: ProgramSpec, *, comm: Any, num_csx: int) -> None:
        """Send the program to every system and MemoryX and wait until each has built it."""
        if spec.mode != "train":
            raise ClusterError(EVAL_REFUSED.format(n=num_csx))
        mutated = mutated_buffers(program)
        if mutated:
            raise ClusterError(f"the step updates buffers ({', '.join(mutated[:3])}{', ...' if len(mutated) > 3 else ''}: "
                               f"running statistics such as BatchNorm's), which each of {num_csx} systems would keep "
                               "for its own batches while MemoryX keeps the weights only: train this model on one "
                               "system, or use a normalisation without running statistics (LayerNorm, GroupNorm)")
        self.num_csx = num_csx
        self.systems = [chief_link(comm, rank) for rank in range(1, num_csx + 1)]
        self.memoryx = chief_link(comm, num_csx + 1)
        blob = torch.frombuffer(bytearray(archive.archive_bytes(program)), dtype=torch.uint8)
        for link in self._everyone():
            link.send({"op": "load", "spec": spec.to_json()}, [blob])
        self._collect(self._everyone(), every=True)
        self._step = 0

    def _everyone(self) -> list[MpiLink]:
        return [*self.systems, self.memoryx]

    def _who(self, link: MpiLink) -> str:
        return "MemoryX" if link is self.memoryx else f"system {link.peer}"

    def _collect(self, links: list[MpiLink], *, every: bool = False) -> list[Any]:
        """Each link's answer to its last request, in the order they come: the first error is raised
        at once (a step that failed on one system leaves the others waiting in its collectives), or
        with ``every`` once all have answered (a load: each task answers for itself)."""
        got: dict[int, Any] = {}
        failed: BaseException | None = None
        idle = Backoff.transfer()
        while len(got) < len(links):
            progressed = False
            for i, link in enumerate(links):
                if i in got or not link.ready():
                    continue
                progressed = True
                try:
                    got[i] = self._answer(link)
                except (SpecError, DeviceError) as exc:
                    if not every:
                        raise
                    got[i], failed = None, failed or exc
            if progressed:
                idle.reset()
            else:
                idle.idle()
        if failed is not None:
            raise failed
        return [got[i] for i in range(len(links))]

    def _answer(self, link: MpiLink) -> Any:
        """The task's answer to the last request: its value, or its error raised here."""
        header, tensors = link.receive()
        op = header.get("op")
        if op == "error":
            message = str(header.get("message", ""))[:2000] or f"{self._who(link)} failed"
            if header.get("user") is True:
                raise SpecError(message)
            raise DeviceError(message)
        if op == "ok":
            return None
        if op != "result":
            raise wire.ProtocolError(f"{self._who(link)} answered {op!r}")
        return wire.decode(header.get("value"), tensors)

    @property
    def step(self) -> int:
        """The global step after the steps finished so far."""
        return self._step

    def run_step(self, batch: Any, publish: Callable[[dict[str, Any]], None] | None = None,
                 plan: StepPlan = FULL_STEP) -> dict[str, torch.Tensor]:
        """One step of the cluster on ``batch`` (:class:`Shards`); the global step's outputs."""
        if not isinstance(batch, Shards) or len(batch.shards) != self.num_csx:
            raise ClusterError(f"a step on a cluster of {self.num_csx} systems takes {self.num_csx} shards")
        if not (plan.backward and plan.update and plan.clear_grads):
            raise ClusterError(f"a cluster of {self.num_csx} systems runs whole training steps (backward, "
                               "optimizer.step(), zero_grad()): gradient accumulation and forward-only steps run "
                               "on one system")
        for link, shard in zip(self.systems, batch.shards):
            tensors: list[torch.Tensor] = []
            link.send({"op": "step", "batch": wire.encode(shard, tensors)}, tensors)
        self.memoryx.send({"op": "step", "plan": plan.to_json()})
        *answers, update = self._collect(self._everyone())
        outputs = reduce_outputs(answers, _batch_size(batch.shards[0]))
        outputs.update(update)
        self._step = int(update["global_step"])
        return outputs

    def state_dict(self) -> dict[str, Any]:
        """MemoryX's training state (weights, optimizer, scaler, global step)."""
        self.memoryx.send({"op": "state"})
        (state,) = self._collect([self.memoryx])
        if not isinstance(state, dict):
            raise wire.ProtocolError("MemoryX's state is not a mapping")
        return state

    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True, load_optimizer: bool = True) -> None:
        """Load ``state`` into MemoryX (the systems take the weights from it at the next step)."""
        tensors: list[torch.Tensor] = []
        self.memoryx.send({"op": "set_state", "state": wire.encode(state, tensors), "strict": strict,
                           "load_optimizer": load_optimizer}, tensors)
        (answer,) = self._collect([self.memoryx])
        self._step = int(answer["global_step"])


def stop_cluster(comm: Any, num_csx: int) -> None:
    """Tell every system and MemoryX to leave (small messages: this does not wait for them)."""
    for rank in range(1, num_csx + 2):
        chief_link(comm, rank).send({"op": "stop"})


def cluster_device(*, comm: Any, num_csx: int, queue_depth: int = 2,
                   notice: Callable[[str], None] | None = None) -> EmbeddedDevice:
    """The chief's device for a cluster of ``num_csx`` systems on ``comm`` (the job's world)."""
    return EmbeddedDevice(queue_depth=queue_depth, notice=notice,
                          engine_factory=lambda program, spec: SwarmEngine(program, spec, comm=comm, num_csx=num_csx))
