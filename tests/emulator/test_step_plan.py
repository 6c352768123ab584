"""Each step's plan (csrun.program.step_plan): what the engine runs after the forward, here
and over the wire, and a plan from the network is checked like any other message."""

from __future__ import annotations

import math

import pytest
import torch

from csrun.compiler.spec import OptimizerSpec
from csrun.emulator.remote.client import RemoteDevice
from csrun.emulator.engine.executor import Engine
from csrun.program.errors import SpecError
from csrun.emulator.remote.server import EmulatorServer
from csrun.program.step_plan import FULL_STEP, StepPlan

from tests.tiny_models import MLP, mlp_batches
from .helpers import make_program, quiet

TOKEN = "step-plan-Hq3Zt9Lw-token-5Vn8Kc"


def program() -> tuple[torch.export.ExportedProgram, object, list]:
    batches = mlp_batches(4)
    torch.manual_seed(0)
    ep, spec = make_program(MLP(), batches[0], precision="float32", optimizer=OptimizerSpec(type="adam"),
                            learning_rate=0.01)
    return ep, spec, batches


def test_a_plan_crosses_the_wire_and_a_bad_one_is_refused_naming_it() -> None:
    plan = StepPlan(update=False, clear_grads=False, max_gradient_norm=1.0, gradient_norm_type=math.inf)
    assert StepPlan.from_json(plan.to_json()) == plan
    assert StepPlan.from_json(None) == FULL_STEP
    for bad in ({"update": "yes"}, {"max_gradient_norm": -1.0}, {"max_gradient_norm": float("nan")},
                {"gradient_norm_type": True}, {"run": True}, ["update"]):
        with pytest.raises(SpecError, match="step plan"):
            StepPlan.from_json(bad)


def test_the_engine_runs_what_each_plan_says() -> None:
    ep, spec, batches = program()
    engine = Engine(ep, spec, notice=quiet)
    before = {n: p.detach().clone() for n, p in engine.named_params}
    out = engine.run_step(batches[0], plan=StepPlan(backward=False, update=False, clear_grads=False))
    assert out["global_step"].item() == 0 and engine.step == 0
    assert all(torch.equal(p, before[n]) for n, p in engine.named_params)  # the forward alone
    engine.run_step(batches[0], plan=StepPlan(update=False))  # gradients kept, no update
    assert engine.step == 0 and all(p.grad is not None for p in engine.params)
    assert all(torch.equal(p, before[n]) for n, p in engine.named_params)
    out = engine.run_step(batches[1], plan=StepPlan(clear_grads=False, max_gradient_norm=1e-3))
    assert engine.step == 1 and out["global_step"].item() == 1 and "grad_norm" in out
    assert all(p.grad is None for p in engine.params)
    reference = Engine(ep, spec, notice=quiet)  # the same two batches' gradients, summed, then clipped
    reference.run_step(batches[0], plan=StepPlan(update=False))
    reference.run_step(batches[1], plan=StepPlan(clear_grads=False, max_gradient_norm=1e-3))
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(engine.named_params, reference.named_params))


def test_a_remote_device_runs_the_plan_it_is_sent() -> None:
    ep, spec, batches = program()
    server = EmulatorServer(token=TOKEN, port=0)
    server.start()
    try:
        with RemoteDevice(f"127.0.0.1:{server.address[1]}", TOKEN, "plan-job") as dev:
            dev.load(ep, spec)
            dev.submit(batches[0], StepPlan(update=False)).result()
            last = dev.submit(batches[1], StepPlan(clear_grads=False, max_gradient_norm=1e-3)).result()
            remote = dev.state_dict()
    finally:
        server.shutdown()
    local = Engine(ep, spec, notice=quiet)
    local.run_step(batches[0], plan=StepPlan(update=False))
    want = local.run_step(batches[1], plan=StepPlan(clear_grads=False, max_gradient_norm=1e-3))
    assert torch.equal(last["grad_norm"], want["grad_norm"]) and remote["global_step"] == 1
    for name, p in local.named_params:
        assert torch.equal(remote["params"][name], p.detach()), name
