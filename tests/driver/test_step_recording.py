"""Whole-step capture (csrun.driver.step_recording): record step 1, replay it, check later steps."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from csrun.driver.step_recording import StepRecorder
from csrun.driver.step_values import StepChanged, StepValue, ValueNotKept, in_closure
from csrun.emulator.errors import DeviceTensorReadError
from tests.tiny_models import KeywordLM, Output, TwoHeads


class MLP(nn.Module):
    """Batch norm then a linear layer, seeded: shaped for these tests, which read its running
    statistics (a recording must leave buffers alone) and its ``fc`` gradients."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.BatchNorm1d(10)
        self.fc = nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x))


def _call(recorder: StepRecorder, model: nn.Module) -> Callable[..., Any]:
    forward = type(model).forward

    def call(*args: Any, **kwargs: Any) -> Any:
        return recorder.model_call(model, lambda *a, **k: forward(model, *a, **k), args, kwargs)

    return call


def _export_and_run(model: nn.Module, recorder_recording: Any, inputs: Any) -> dict[str, torch.Tensor]:
    forward = type(model).forward
    model.forward = recorder_recording.replay_forward(lambda *a, **k: forward(model, *a, **k))  # type: ignore[method-assign]
    try:
        program = torch.export.export(model, (inputs,), strict=False)
    finally:
        del model.forward
    return program.module()(inputs)


def _typical_step(call: Callable[..., Any], batch: Any) -> tuple[Any, Any, Any]:
    inputs, targets = batch
    outputs = call(inputs)
    loss = nn.CrossEntropyLoss()(outputs, targets)
    loss.backward()
    acc = (outputs.argmax(1) == targets).float().mean()
    return loss, acc, outputs


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 10, generator=g), torch.randint(0, 3, (16,), generator=g)


def test_the_typical_loop_replays_to_the_eager_loss_and_gradients() -> None:
    model = MLP()
    recorder = StepRecorder()
    batch = _batch()
    loss, acc, outputs = _typical_step(_call(recorder, model), recorder.begin(batch, 1))
    assert isinstance(loss, StepValue) and loss.shape == () and outputs.shape == (16, 3)
    recording, state = recorder.end()
    assert recording.output_names[recording.loss] == "loss"
    assert {"loss", f"v{outputs._ref}", f"v{acc._ref}"} <= set(recording.output_names.values())

    out = _export_and_run(model, recording, state.inputs)
    eager_model = MLP()
    eager = nn.CrossEntropyLoss()(eager_model(batch[0]), batch[1])
    eager.backward()
    out["loss"].backward()
    assert torch.equal(out["loss"].detach(), eager.detach())
    assert torch.equal(model.fc.weight.grad, eager_model.fc.weight.grad)
    eager_acc = (eager_model(batch[0]).argmax(1) == batch[1]).float().mean()
    assert torch.equal(out[f"v{acc._ref}"], eager_acc)


def test_recording_leaves_buffers_and_rng_alone() -> None:
    model = MLP()
    model.train()
    before = model.norm.running_mean.clone()
    rng = torch.get_rng_state()
    recorder = StepRecorder()
    _typical_step(_call(recorder, model), recorder.begin(_batch(), 1))
    recorder.end()
    assert torch.equal(model.norm.running_mean, before)
    assert torch.equal(torch.get_rng_state(), rng)


def test_keyword_calls_and_a_dataclass_output() -> None:
    model = KeywordLM(20, seed=1)
    recorder = StepRecorder()
    g = torch.Generator().manual_seed(2)
    batch = {"input_ids": torch.randint(0, 20, (4, 6), generator=g), "labels": torch.randint(0, 20, (4, 6), generator=g)}
    step = recorder.begin(batch, 1)
    out = _call(recorder, model)(**step)
    assert isinstance(out, Output) and isinstance(out.loss, StepValue) and out.logits.shape == (4, 6, 20)
    out.loss.backward()
    recording, state = recorder.end()
    replayed = _export_and_run(model, recording, state.inputs)
    eager = KeywordLM(20, seed=1)(**batch)
    assert torch.equal(replayed["loss"].detach(), eager.loss.detach())


def test_two_outputs_combined_and_a_model_called_twice() -> None:
    model = TwoHeads(10, seed=3)
    recorder = StepRecorder()
    batch = _batch()
    x, y = recorder.begin(batch, 1)
    call = _call(recorder, model)
    logits, score = call(x)
    logits2, _ = call(x * 2)
    loss = F.cross_entropy(logits, y) + 0.5 * score.pow(2).mean() + 0.1 * F.cross_entropy(logits2, y)
    loss.backward()
    recording, state = recorder.end()
    assert sum(1 for e in recording.entries if e.func is None) == 2
    replayed = _export_and_run(model, recording, state.inputs)
    a, s = TwoHeads(10, seed=3)(batch[0])
    a2, _ = TwoHeads(10, seed=3)(batch[0] * 2)
    eager = F.cross_entropy(a, batch[1]) + 0.5 * s.pow(2).mean() + 0.1 * F.cross_entropy(a2, batch[1])
    assert torch.allclose(replayed["loss"], eager, rtol=0, atol=1e-6)


def _record_then_check(step_fn: Callable[..., Any], changed_fn: Callable[..., Any]) -> StepChanged:
    model = MLP()
    recorder = StepRecorder()
    call = _call(recorder, model)
    step_fn(call, recorder.begin(_batch(0), 1))
    recording, _ = recorder.end()
    recorder.compiled(recording)
    for n in (2, 3):  # the same step checks clean
        step_fn(call, recorder.begin(_batch(n), n))
        recorder.end()
    with pytest.raises(StepChanged) as info:
        changed_fn(call, recorder.begin(_batch(9), 4))
        recorder.end()
    return info.value


def test_another_loss_is_refused_naming_the_line() -> None:
    def other_loss(call: Callable[..., Any], batch: Any) -> None:
        outputs = call(batch[0])
        loss = F.mse_loss(outputs, F.one_hot(batch[1], 3).float())  # the changed line
        loss.backward()

    err = _record_then_check(_typical_step, other_loss)
    assert err.location is not None and err.location.filename == __file__
    assert "the changed line" in str(err) and "cross_entropy" in str(err)


def test_another_branch_is_refused_naming_the_line() -> None:
    def branchy(call: Callable[..., Any], batch: Any, *, extra: bool = False) -> None:
        outputs = call(batch[0])
        loss = F.cross_entropy(outputs, batch[1])
        if extra:
            loss = loss + 0.01 * outputs.abs().mean()  # the other branch
        loss.backward()

    err = _record_then_check(branchy, lambda c, b: branchy(c, b, extra=True))
    assert "the other branch" in str(err)


def test_a_step_that_ends_early_is_refused() -> None:
    def forward_only(call: Callable[..., Any], batch: Any) -> None:
        call(batch[0])

    err = _record_then_check(_typical_step, forward_only)
    assert "ended early" in str(err)


def test_a_changed_batch_shape_is_refused() -> None:
    model = MLP()
    recorder = StepRecorder()
    _typical_step(_call(recorder, model), recorder.begin(_batch(), 1))
    recorder.compiled(recorder.end()[0])
    with pytest.raises(StepChanged, match="shapes changed"):
        _typical_step(_call(recorder, model), recorder.begin((torch.randn(8, 10), torch.zeros(8, dtype=torch.long)), 2))


@pytest.mark.parametrize("read", [
    lambda v: v.item(), lambda v: float(v), lambda v: f"{v}", lambda v: bool(v < 1), lambda v: v.tolist(),
    lambda v: v.numpy(), lambda v: print(v),
])
def test_reading_a_value_in_the_step_gives_the_hint(read: Callable[[Any], Any]) -> None:
    recorder = StepRecorder()
    loss, _, _ = _typical_step(_call(recorder, MLP()), recorder.begin(_batch(), 1))
    with pytest.raises(DeviceTensorReadError, match="step closure"):
        read(loss)


@pytest.mark.parametrize("which,use", [
    ("loss", lambda v: v.item()), ("loss", lambda v: float(v)), ("loss", lambda v: f"{v:.3f}"),
    ("loss", lambda v: v < 1), ("outputs", lambda v: v[0]), ("outputs", lambda v: v.cpu()),
    ("loss", lambda v: v.detach()), ("outputs", lambda v: v + 1), ("outputs", lambda v: v.tolist()),
])
def test_after_the_step_values_are_read_only_in_closures(which: str, use: Callable[[Any], Any]) -> None:
    model = MLP()
    recorder = StepRecorder()
    batch = _batch()
    loss, _, outputs = _typical_step(_call(recorder, model), recorder.begin(batch, 1))
    recording, state = recorder.end()
    results = _export_and_run(model, recording, state.inputs)
    state.outputs = lambda: {k: v.detach() for k, v in results.items()}
    value = outputs if which == "outputs" else loss
    with pytest.raises(DeviceTensorReadError, match="step closure"):
        use(value)
    with in_closure():
        got = use(value)
    expected = use(results[recording.output_names[value._ref]].detach())
    if isinstance(expected, torch.Tensor):
        assert torch.equal(got, expected)
    else:
        assert got == expected


def test_a_value_the_step_did_not_keep_names_its_line() -> None:
    model = MLP()
    recorder = StepRecorder()
    batch = _batch()
    x, y = recorder.begin(batch, 1)
    outputs = _call(recorder, model)(x)
    loss = F.cross_entropy(outputs, y)
    loss.backward()
    recording, state = recorder.end()
    results = _export_and_run(model, recording, state.inputs)
    state.outputs = lambda: results
    recorder.compiled(recording)
    x, y = recorder.begin(_batch(1), 2)
    outputs = _call(recorder, model)(x)
    scaled = F.cross_entropy(outputs, y)  # kept: it is the loss
    scaled.backward()
    _, state2 = recorder.end()
    state2.outputs = lambda: results
    with in_closure():
        assert torch.equal(scaled.detach(), results["loss"].detach())
    lonely = recording.entries[1].results[0]
    assert lonely == recording.loss
    hidden = StepValue(recorder, state2, 999, torch.Size([]), torch.float32)
    with in_closure(), pytest.raises(ValueNotKept):
        hidden.item()
