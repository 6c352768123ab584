"""System semantics: the captured step runs (not the user's Python), device tensors are read only
at step boundaries, step errors surface at the next boundary, state round-trips."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from csrun.compiler.spec import LossScalingSpec, OptimizerSpec
from csrun.emulator.embedded import EmbeddedDevice
from csrun.emulator.engine.executor import Engine, parse_device
from csrun.emulator.errors import DeviceTensorReadError
from csrun.program.errors import SpecError
from csrun.program.errors import StepFailed

from tests.tiny_models import MLP, mlp_batches
from .helpers import input_specs, make_program, make_spec, quiet


class Counting(MLP):
    """An MLP whose forward bumps a Python counter (a side effect outside the graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        self.calls += 1
        return super().forward(batch)


def test_python_side_effect_happens_once_with_the_program_every_step_in_eager() -> None:
    batches = mlp_batches(5)
    model = Counting()
    ep, spec = make_program(model, batches[0])
    at_capture = model.calls  # capture may run (or undo) the side effect; after it, it never moves
    with EmbeddedDevice(notice=quiet) as dev:
        dev.load(ep, spec)
        for h in [dev.submit(b) for b in batches]:
            h.result()
    assert model.calls == at_capture  # the program ran five steps; the Python never ran again
    for b in batches:
        model(b)
    assert model.calls == at_capture + 5  # eager runs it every step


def test_reading_a_device_tensor_outside_a_step_closure_is_refused() -> None:
    batches = mlp_batches(2)
    ep, spec = make_program(MLP(), batches[0])
    with EmbeddedDevice(notice=quiet) as dev:
        dev.load(ep, spec)
        handle = dev.submit(batches[0])
        loss = handle["loss"]
        reads = [lambda: loss.item(), lambda: float(loss), lambda: bool(loss), lambda: repr(loss),
                 lambda: str(loss), lambda: loss + 1, lambda: 2 * loss, lambda: loss < 3, lambda: f"{loss:.3f}",
                 lambda: int(loss), lambda: loss.tolist()]
        for read in reads:
            with pytest.raises(DeviceTensorReadError, match=r"step closure \(use cbtorch.add_step_closure / @step_closure\)"):
                read()
        value = loss.resolve()  # what the step-closure machinery does at the boundary
        assert value.device.type == "cpu" and value.dim() == 0
        assert handle.result()["loss"] is value


def test_outputs_come_before_the_update_and_a_later_failure_still_poisons_the_device() -> None:
    """A training step's handle resolves once the forward has run; if its update then fails, the
    values already handed out stand, and the next step and the next state fetch raise."""
    batches = mlp_batches(3)
    ep, spec = make_program(MLP(), batches[0])
    with EmbeddedDevice(notice=quiet) as dev:
        dev.load(ep, spec)
        dev.synchronize()
        engine = dev._engine
        assert engine is not None
        update_started = threading.Event()
        release = threading.Event()
        def slow_failing_update(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            update_started.set()
            release.wait(10)
            raise RuntimeError("the update broke")

        hook = engine.optimizer.register_step_pre_hook(slow_failing_update)  # a hooked optimizer runs its own step
        handle = dev.submit(batches[0])
        loss = handle.result(timeout=5)["loss"]  # resolves although the update cannot finish
        assert loss.dim() == 0 and update_started.wait(10) and not release.is_set()
        release.set()
        with pytest.raises(StepFailed, match="step 1 failed on the device"):
            dev.synchronize()
        with pytest.raises(StepFailed):
            dev.submit(batches[1])
        hook.remove()


def test_step_errors_surface_at_the_next_boundary() -> None:
    batches = mlp_batches(3)
    ep, spec = make_program(MLP(), batches[0])
    with EmbeddedDevice(notice=quiet) as dev:
        dev.load(ep, spec)
        ok = dev.submit(batches[0])
        bad_labels = (batches[1][0], torch.full_like(batches[1][1], 99))  # out of range: fails in the graph
        bad = dev.submit(bad_labels)
        assert ok.result()["loss"].dim() == 0
        with pytest.raises(StepFailed, match="step 2 failed on the device"):
            bad.result()
        with pytest.raises(StepFailed):
            dev.submit(batches[2])
    ep, spec = make_program(MLP(), batches[0], inputs=input_specs(batches[0]))
    with EmbeddedDevice(notice=quiet) as dev:
        dev.load(ep, spec)
        wrong = dev.submit((torch.randn(3, 12), torch.zeros(3, dtype=torch.long)))
        with pytest.raises(SpecError, match="sizes must be static"):
            wrong.result()


def test_checkpoint_resume_equals_uninterrupted() -> None:
    batches = mlp_batches(10)
    ep, spec = make_program(
        MLP(), batches[0], optimizer=OptimizerSpec(type="adamw", hyperparameters={"weight_decay": 0.01}),
        learning_rate={"scheduler": "CosineDecay", "initial_learning_rate": 0.01, "decay_steps": 10},
        loss_scaling=LossScalingSpec(factor="dynamic", initial_loss_scale=256.0, steps_per_increase=3),
        precision="bfloat16")
    whole = Engine(ep, spec, notice=quiet)
    full = [whole.run_step(b)["loss"] for b in batches]
    first = Engine(ep, spec, notice=quiet)
    for b in batches[:5]:
        first.run_step(b)
    saved = first.state_dict()
    assert saved["global_step"] == 5 and saved["scaler"]["good_steps"] == 2
    second = Engine(ep, spec, notice=quiet)
    second.load_state_dict(saved)
    rest = [second.run_step(b) for b in batches[5:]]
    assert [r["loss"].item() for r in rest] == [x.item() for x in full[5:]]
    assert rest[0]["loss_scale"].item() == 512.0  # the scaler state came back too
    end_a, end_b = whole.state_dict(), second.state_dict()
    assert all(torch.equal(end_a["params"][k], end_b["params"][k]) for k in end_a["params"])
    assert end_b["global_step"] == 10


def test_a_loaded_state_is_copied_not_shared() -> None:
    """Training after load_state_dict leaves the caller's state as it was (torch's optimizer keeps
    the tensors it is given: they used to be the device's moments from then on), so loading the
    same state twice gives the same run."""
    batches = mlp_batches(4)
    ep, spec = make_program(MLP(), batches[0], optimizer=OptimizerSpec(type="adamw", hyperparameters={}))
    source = Engine(ep, spec, notice=quiet)
    for b in batches:
        source.run_step(b)
    saved = source.state_dict()
    before = [t.clone() for t in torch.utils._pytree.tree_leaves(saved["optimizer"]) if isinstance(t, torch.Tensor)]
    runs = []
    for _ in range(2):
        engine = Engine(ep, spec, notice=quiet)
        engine.load_state_dict(saved)
        runs.append([engine.run_step(b)["loss"].item() for b in batches])
    after = [t for t in torch.utils._pytree.tree_leaves(saved["optimizer"]) if isinstance(t, torch.Tensor)]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert runs[0] == runs[1]


def test_eval_program_runs_forward_only() -> None:
    batches = mlp_batches(3)
    ep, _ = make_program(MLP(), batches[0])
    eng = Engine(ep, make_spec(mode="eval", optimizer=None), notice=quiet)
    before = eng.state_dict()
    outs = [eng.run_step(b) for b in batches]
    assert set(outs[0]) == {"loss"}
    after = eng.state_dict()
    assert all(torch.equal(before["params"][k], after["params"][k]) for k in before["params"])
    assert after["global_step"] == 0 and after["optimizer"] is None


def test_extra_outputs_and_int32_inputs() -> None:
    class WithExtras(nn.Module):
        """Returns an output beside the loss and takes integer labels: this test's shape."""

        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            logits = self.lin(batch["x"])
            return {"loss": nn.functional.cross_entropy(logits, batch["y"]), "pred": logits.argmax(-1)}

    b = {"x": torch.randn(6, 4), "y": torch.randint(0, 3, (6,))}
    from csrun.compiler.spec import TensorSpec

    ep, spec = make_program(WithExtras(), b, inputs=(TensorSpec(path="['x']", dtype="float32", shape=(6, 4)),
                                                      TensorSpec(path="['y']", dtype="int64", shape=(6,))))
    eng = Engine(ep, spec, notice=quiet)
    out = eng.run_step({"x": b["x"], "y": b["y"].to(torch.int32)})  # int32 on the wire, int64 as captured
    assert set(out) == {"loss", "lr", "loss_scale", "global_step", "pred"}
    assert out["pred"].shape == (6,) and out["global_step"].item() == 1


@pytest.mark.parametrize("device,needle", [("tpu", "cpu, cuda or cuda:<index>"), ("cuda:4096", "CUDA"),
                                           ("bogus:device", "not a device")])
def test_bad_devices(device: str, needle: str) -> None:
    with pytest.raises(SpecError, match="device") as info:
        parse_device(device)
    assert needle in str(info.value)


def test_submit_returns_before_the_step_runs_and_depth_bounds_in_flight() -> None:
    batches = mlp_batches(1, bs=4096)
    ep, spec = make_program(MLP(d_in=12, hidden=256), batches[0])
    with EmbeddedDevice(notice=quiet, queue_depth=2) as dev:
        dev.load(ep, spec)
        first = dev.submit(batches[0])
        assert not first.done()  # returned at once; the step is still running
        handles = [first] + [dev.submit(batches[0]) for _ in range(3)]
        # the fourth submit could only return once the first two had finished (depth 2)
        assert first.done() and handles[1].done()
        dev.synchronize()
        assert all(h.done() for h in handles) and dev.global_step == 4


def test_refused_load_is_not_fatal_and_param_names_follow_the_optimizer() -> None:
    batches = mlp_batches(2)
    ep, _ = make_program(MLP(), batches[0])
    with EmbeddedDevice(notice=quiet) as dev:
        with pytest.raises(SpecError, match="unknown optimizer_type 'adamz'"):
            dev.load(ep, make_spec(optimizer=OptimizerSpec(type="adamz")))
        dev.load(ep, make_spec(optimizer=OptimizerSpec(
            type="adamw", hyperparameters={"weight_decay": 0.1, "exclude_from_weight_decay": ["bias"]})))
        dev.submit(batches[0]).result()
        state = dev.state_dict()
    assert state["param_names"] == ["l1.weight", "l2.weight", "l1.bias", "l2.bias"]
    assert [g["weight_decay"] for g in state["optimizer"]["param_groups"]] == [0.1, 0.0]
