"""A cluster's system or MemoryX task: ``python -m csrun.emulator.swarm.task``.

In a job of N > 1 systems (``csrun_wse --num-csx N``: ``CSRUN_NUM_CSX``), the task wrapper
runs this instead of the user's command on ranks 1..N (the **systems**) and N+1 (**MemoryX**);
the user's script never runs there. The task joins MPI, forms the swarm's communicator with the
other systems and MemoryX (``MPI_Comm_create_group``: only they take part), and serves the
chief's frames (:mod:`csrun.emulator.swarm.link`) until it says ``stop``:

============  =====================================  ==========================================
op            from the chief                         answer
============  =====================================  ==========================================
``load``      the program archive and its spec       ``ok``; each builds an engine (MemoryX on
                                                     the CPU: the float32 master weights, the
                                                     optimizer, schedule and scaler; a system on
                                                     ``CSRUN_SYSTEM_DEVICE``, default cpu)
``step``      a system: its shard; MemoryX: the      a system: its shard's outputs; MemoryX:
              step's plan                            ``lr``, ``loss_scale``, ``global_step``
                                                     (and ``grad_norm``): one step of
                                                     :mod:`csrun.emulator.swarm.roles`
``state``     (MemoryX) --                           the whole training state
``set_state`` (MemoryX) a state, strict,             ``ok``
              load_optimizer
``stop``      --                                     none: the task leaves MPI and exits 0
============  =====================================  ==========================================

A program the task cannot build (a malformed spec or archive, one its engine refuses) is
answered with an ``error`` frame and the task waits for the next load. Waiting for a frame, the
task looks once a second for the chief's exit report in the job's state folder: a chief that
ended without its ``stop`` (``os._exit``, a script that never used csrun's API) does not leave
the task waiting; it exits 0 and the chief's own code is the job's. Each system seeds torch's
generator with its rank added, so the systems' dropout masks differ. A step that fails is
answered with an ``error`` frame naming the task, and the task ends with exit code 1 and a last
word (:mod:`csrun.task_exits`): the other tasks wait in the step's collectives, and the
launcher's supervisor ends the job naming this one. Nothing a frame carries is unpickled or
run: programs are read by :mod:`csrun.program.archive`, values by the wire's decoder.

Signals: the task wrapper starts this task with the stop signals (SIGINT, SIGTERM, SIGHUP,
SIGUSR1, SIGUSR2) ignored (:mod:`csrun.launch.task`). They are the chief's to act on: asked to
stop, it saves its checkpoint from MemoryX's ``state`` and then sends ``stop``; Slurm signals
every task of a step (``scancel``, a preemption), and a system or MemoryX that died of it first
would lose the steps since the last checkpoint. The task ends by ``stop``, by the chief's end,
or by SIGKILL (the launcher ending a failed job; its wrapper when the launcher is gone).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

import torch

from csrun.cluster import ClusterInfo, cluster_info, MEMORYX
from csrun.emulator.embedded import outputs_to_cpu
from csrun.emulator.engine.executor import Engine
from csrun.emulator.remote import wire
from csrun.emulator.remote.errors import ProgramRejected
from csrun.emulator.remote.wire import ProtocolError
from csrun.emulator.swarm.link import LinkClosed, MpiLink, task_link
from csrun.emulator.swarm.roles import MemoryXRole, SystemRole
from csrun.emulator.swarm.swarmx import SwarmX
from csrun.env_settings import JOB_STATE, SYSTEM_DEVICE
from csrun.errors import UserError
from csrun.program import archive
from csrun.program.spec import ProgramSpec
from csrun.program.step_plan import StepPlan
from csrun.stream.wire import group_communicator, mpi
from csrun.task_exits import describe, last_word, read_exits

PROG = "csrun (cluster task)"


def swarm_communicator(world: Any, num_csx: int) -> Any:
    """The systems' and MemoryX's communicator (world ranks 1..N+1; MemoryX is its rank N):
    collective over those tasks only."""
    return group_communicator(world, list(range(1, num_csx + 2)))


class SwarmTask:
    """One system or MemoryX: the engine it built for the loaded program and its role in a step."""

    def __init__(self, info: ClusterInfo, link: MpiLink, swarm: SwarmX) -> None:
        self.info = info
        self.link = link
        self.swarm = swarm
        self.is_memoryx = info.role == MEMORYX
        self.role: MemoryXRole | SystemRole | None = None
        self.device = "cpu" if self.is_memoryx else (os.environ.get(SYSTEM_DEVICE.name, "").strip() or "cpu")

    @property
    def name(self) -> str:
        """``system i`` or ``MemoryX``, for messages."""
        return "MemoryX" if self.is_memoryx else f"system {self.info.rank}"

    def load(self, header: dict[str, Any], tensors: list[torch.Tensor]) -> None:
        """Build the engine and the role for the program the chief sent."""
        spec_text = header.get("spec")
        if not isinstance(spec_text, str) or len(tensors) != 1 or tensors[0].dtype != torch.uint8 \
                or tensors[0].dim() != 1:
            raise ProtocolError("a load frame carries the spec and one 1-d uint8 archive")
        try:
            spec = ProgramSpec.from_json(spec_text)
        except Exception as exc:  # noqa: BLE001 - any malformed spec is refused in one line
            raise UserError(f"program spec is malformed ({type(exc).__name__}: {exc})") from None
        try:
            program = archive.read_archive(tensors[0].numpy().tobytes(), source="program sent by the chief")
        except archive.ArchiveRefused as exc:
            raise ProgramRejected(str(exc)) from None
        self.role = None
        engine = Engine(program, spec, self.device)
        self.role = MemoryXRole(engine, self.swarm) if self.is_memoryx else SystemRole(engine, self.swarm)

    def step(self, header: dict[str, Any], tensors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """One data-parallel step: a system's shard outputs, or MemoryX's update figures."""
        if self.role is None:
            raise ProtocolError("a step before any program was loaded")
        if isinstance(self.role, MemoryXRole):
            return outputs_to_cpu(self.role.step(StepPlan.from_json(header.get("plan"))))
        return outputs_to_cpu(self.role.step(wire.decode(header.get("batch"), tensors)))

    def memoryx(self) -> MemoryXRole:
        """MemoryX's role (a state request anywhere else is a protocol error)."""
        if not isinstance(self.role, MemoryXRole):
            raise ProtocolError(f"{self.name} holds no training state: ask MemoryX")
        return self.role

    def serve(self) -> int:
        """Answer the chief's frames until ``stop``; the task's exit code."""
        while True:
            header, tensors = self.link.receive()
            op = header.get("op")
            if op == "stop":
                return 0
            try:
                if op == "load":
                    self.load(header, tensors)
                    self.link.send({"op": "ok"})
                    continue
                if op == "step":
                    out: dict[str, Any] = self.step(header, tensors)
                elif op == "state":
                    out = self.memoryx().engine.state_dict()
                elif op == "set_state":
                    state = wire.decode(header.get("state"), tensors)
                    if not isinstance(state, dict):
                        raise ProtocolError("set_state without a state mapping")
                    self.memoryx().engine.load_state_dict(state, strict=bool(header.get("strict", True)),
                                                          load_optimizer=bool(header.get("load_optimizer", True)))
                    out = {"global_step": self.memoryx().engine.step}
                else:
                    raise ProtocolError(f"unknown op {op!r}")
            except UserError as exc:
                if op != "load":  # a refused load leaves nothing half done: the chief decides
                    raise
                self.link.send({"op": "error", "user": True, "message": f"{self.name}: {exc}"})
                continue
            sent: list[torch.Tensor] = []
            self.link.send({"op": "result", "value": wire.encode(out, sent)}, sent)


def chief_ended(environ: dict[str, str] | None = None) -> Callable[[], bool] | None:
    """Whether the chief has ended (its wrapper's report in the job's state folder), for a task that
    waits for its next frame; None outside a csrun_wse job (no state folder)."""
    state = (os.environ if environ is None else environ).get(JOB_STATE.name, "")
    if not state:
        return None
    return lambda: 0 in read_exits(state)


def _body(info: ClusterInfo) -> int:
    MPI = mpi()
    world = MPI.COMM_WORLD
    torch.manual_seed(torch.initial_seed() + info.rank)  # each system draws its own random numbers (dropout)
    swarm = SwarmX(swarm_communicator(world, info.num_csx), memoryx=info.num_csx)
    task = SwarmTask(info, task_link(world, chief_ended()), swarm)
    try:
        code = task.serve()
    except LinkClosed:  # the chief ended (its own code says how) without telling this task to stop
        return 0
    except BaseException as exc:
        cause = f"{task.name} failed: {describe(exc)}"
        try:
            task.link.send({"op": "error", "message": cause})
        finally:
            last_word(1, info.rank, info.node_name, cause)
        print(f"{PROG}: error: rank {info.rank}: {cause}", file=sys.stderr, flush=True)
        return 1
    if not MPI.Is_finalized():
        MPI.Finalize()
    return code


def main() -> int:
    """The task's entry point: serve the chief as this rank's role; the exit code."""
    info = cluster_info()
    if not info.in_swarm:
        print(f"{PROG}: error: rank {info.rank} is not a system or MemoryX of a cluster (CSRUN_NUM_CSX="
              f"{info.num_csx}): csrun_wse --num-csx N starts these tasks itself", file=sys.stderr, flush=True)
        return 2
    return _body(info)


if __name__ == "__main__":
    sys.exit(main())
