"""Issue 30: the device trains what the script says, bitwise as the CPU path in float32, or
refuses naming the script's line: param groups, torch's clipping, a forward after the update,
Python values the model branches on, steps without optimizer.step(), the verify check, and a
failed or half-read Session."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.nn.utils.clip_grad as _torch_clip_grad
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

# torch's own clip_grad_norm_, as a script that bound it before importing csrun holds it.
EARLY_CLIP = _torch_clip_grad.clip_grad_norm_
if EARLY_CLIP.__module__ != "torch.nn.utils.clip_grad":  # csrun already put its own there: take torch's back
    from csrun.driver import clipping as _clipping

    EARLY_CLIP = _clipping._ORIGINAL[_clipping.NORM]

import csrun.pytorch as cstorch  # noqa: E402
import csrun.torch as cbtorch  # noqa: E402
from csrun.compiler import CompileSettings  # noqa: E402
from csrun.compiler.errors import TensorToScalar  # noqa: E402
from csrun.compiler.python_state import ForwardChangesPythonState  # noqa: E402
from csrun.driver.clipping import ClippingError  # noqa: E402
from csrun.driver.steps import GradientAccumulation, StepOrderError  # noqa: E402
from csrun.driver.verify import DeviceDiffers  # noqa: E402
from csrun.emulator.errors import DeviceTensorReadError
from csrun.errors import UserError  # noqa: E402
from csrun.program import optimizer_classes as engine_optimizers  # noqa: E402
from csrun.pytorch import backends as cstorch_backend  # noqa: E402
from csrun.torch import process_state as state_mod  # noqa: E402

from tests.tiny_models import Classifier  # noqa: E402
from .same_as_eager import (  # noqa: E402
    F32, MARKS, STEPS, Marks, Run, Stack, Switch, assert_bitwise, both, data, found, keep, plain_step, run,
    snapshot, two_sgd_groups,
)

pytestmark = pytest.mark.timeout(120)

HERE = Marks(__file__)
line_of, at_line = HERE.line, HERE.at


# --------------------------------------------------------------------------------------------
# models whose marked lines the refusals must name


class Counter(Switch):
    """A forward that counts its calls in a Python int and branches on it."""

    def __init__(self) -> None:
        super().__init__()
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.step += 1  # L:counter
        return self.a(x) if self.step < 3 else self.b(x)


class Decay(nn.Module):
    """A forward that makes a tensor buffer's value the scalar of an addcdiv."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.register_buffer("step", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.step += 1
        h = self.fc(x)
        t1, t2 = torch.tanh(h), 1.0 + h * h
        y = h.addcdiv(t1, t2, value=torch.where(self.step > 2, self.step.float() * 0.1, 0.5))  # L:addcdiv
        return y


def test_two_sgd_param_groups_train_bitwise_as_the_cpu_path(tmp_path: Path) -> None:
    """Two SGD groups (lr, weight_decay, momentum differ): the device equals the CPU path, which is eager torch."""
    cpu, dev = both(tmp_path, plain_step, optimizer=two_sgd_groups)
    assert_bitwise(cpu, dev)
    assert dev.lrs == [0.1, 0.5] and dev.global_step == STEPS
    torch.manual_seed(1)
    eager = Stack(6, 16, 3)
    opt = two_sgd_groups(eager)
    for x, y in DataLoader(data(), batch_size=8):
        opt.zero_grad()
        F.cross_entropy(eager(x), y).backward()
        opt.step()
    for name, want in eager.state_dict().items():
        assert torch.equal(dev.state[name], want), name


def test_three_sgd_param_groups_train_bitwise(tmp_path: Path) -> None:
    """Three groups, each with its own lr/momentum/weight_decay/nesterov."""
    def three(m: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD([{"params": m[0].parameters(), "lr": 0.05},
                                {"params": m[1].parameters(), "lr": 0.2, "momentum": 0.5, "weight_decay": 0.01},
                                {"params": m[2].parameters(), "lr": 0.4, "momentum": 0.9, "nesterov": True}],
                               lr=0.1)

    cpu, dev = both(tmp_path, plain_step, model=lambda: Stack(6, 16, 8, 3), optimizer=three)
    assert_bitwise(cpu, dev)
    assert dev.lrs == [0.05, 0.2, 0.4]


def test_adamw_groups_differing_in_lr_weight_decay_betas_eps(tmp_path: Path) -> None:
    """AdamW whose two groups differ in every hyperparameter."""
    def adamw(m: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW([
            {"params": m[0].parameters(), "lr": 1e-2, "weight_decay": 0.0, "betas": (0.9, 0.99), "eps": 1e-8},
            {"params": m[1].parameters(), "lr": 3e-3, "weight_decay": 0.2, "betas": (0.8, 0.95), "eps": 1e-3}])

    cpu, dev = both(tmp_path, plain_step, optimizer=adamw)
    assert_bitwise(cpu, dev)
    assert dev.lrs == [1e-2, 3e-3]


def test_steplr_over_two_groups(tmp_path: Path) -> None:
    """torch's StepLR over two groups with different lrs: each group's schedule, its final lr as the CPU path's."""
    def step_lr(opt: Any) -> Any:
        return torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)

    cpu, dev = both(tmp_path, plain_step, optimizer=two_sgd_groups, scheduler=step_lr)
    assert_bitwise(cpu, dev)
    assert dev.lrs == [0.1 * 0.5 * 0.5, 0.5 * 0.5 * 0.5]  # 8 steps: decayed at 3 and 6


def cstorch_run(kind: str, artifact_dir: Path, momentum: float,
                clip: bool = False) -> tuple[list[float], dict[str, torch.Tensor], list[float]]:
    """A 2.x script: cstorch.optim.SGD with two groups, a traced step (``clip``: with torch's
    clip_grad_norm_ in it), losses read in a closure."""
    state_mod.reset_for_tests()
    cstorch_backend.reset_for_tests()
    try:
        backend = cstorch.backend(kind, artifact_dir=str(artifact_dir / kind))
        torch.manual_seed(1)
        with backend.device:
            model = Stack(6, 16, 3)
        compiled = cstorch.compile(model, backend)
        opt = cstorch.optim.SGD([{"params": model[0].parameters(), "lr": 0.1},
                                 {"params": model[1].parameters(), "lr": 0.5, "momentum": momentum,
                                  "weight_decay": 0.1}],
                                lr=0.1)
        losses: list[float] = []

        @cstorch.trace
        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            opt.zero_grad()
            loss = F.cross_entropy(compiled(x), y)
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            opt.step()
            return loss

        @cstorch.step_closure
        def record(loss: torch.Tensor) -> None:
            losses.append(loss.detach().item())

        loader = cstorch.utils.data.DataLoader(DataLoader, data(), batch_size=8, drop_last=True)
        for x, y in cstorch.utils.data.DataExecutor(loader):
            record(step(x, y))
        return losses, snapshot(model), [g["lr"] for g in opt.state_dict()["param_groups"]]
    finally:
        state_mod.reset_for_tests()
        cstorch_backend.reset_for_tests()


@pytest.mark.parametrize("momentum,clip", [(0.0, False), (0.9, False), (0.9, True)])
def test_cstorch_sgd_with_two_groups(tmp_path: Path, momentum: float, clip: bool) -> None:
    """cstorch.optim.SGD with two groups (lr, weight_decay, momentum) on CSX equals the CPU backend
    bitwise, also with clip_grad_norm_ in the @cstorch.trace step."""
    cpu_losses, cpu_state, cpu_lrs = cstorch_run("CPU", tmp_path, momentum, clip)
    dev_losses, dev_state, dev_lrs = cstorch_run("CSX", tmp_path, momentum, clip)
    assert len(cpu_losses) == STEPS and dev_losses == cpu_losses
    for name, want in cpu_state.items():
        assert torch.equal(dev_state[name], want), name
    assert dev_lrs == cpu_lrs == [0.1, 0.5]


# --------------------------------------------------------------------------------------------
# 2. torch's clipping in the step


@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_clip_grad_norm_clips_bitwise_and_returns_the_norm(tmp_path: Path, norm_type: float) -> None:
    """clip_grad_norm_ between backward and step: the weights bitwise, the returned norm each step's."""
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.2, norm_type=norm_type)
        opt.step()
        keep(out.losses, loss)
        cbtorch.add_step_closure(lambda n: out.values.append(float(n)), (norm,))

    cpu, dev = both(tmp_path, body)
    assert_bitwise(cpu, dev)
    assert len(dev.values) == STEPS and max(dev.values) > 0.2  # the clip bit
    unclipped = run(None, tmp_path, plain_step)
    assert not torch.equal(unclipped.state["0.weight"], dev.state["0.weight"])


def test_clip_grad_value_clips_bitwise(tmp_path: Path) -> None:
    """clip_grad_value_ between backward and step clips on the device as eager does."""
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.02)
        opt.step()
        keep(out.losses, loss)

    cpu, dev = both(tmp_path, body)
    assert_bitwise(cpu, dev)
    unclipped = run(None, tmp_path, plain_step)
    assert not torch.equal(unclipped.state["0.weight"], dev.state["0.weight"])


def clip_some(model: nn.Module, loss: torch.Tensor) -> None:
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model[0].parameters(), 1.0)  # L:clip-some


def clip_before_backward(model: nn.Module, loss: torch.Tensor) -> None:
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # L:clip-outside
    loss.backward()


def clip_nonfinite(model: nn.Module, loss: torch.Tensor) -> None:
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)  # L:clip-nonfinite


def clip_early_bound(model: nn.Module, loss: torch.Tensor) -> None:
    loss.backward()
    EARLY_CLIP(model.parameters(), 1.0)  # L:clip-early


@pytest.mark.parametrize("clip, marker, cls, words", [
    (clip_some, "clip-some", ClippingError, "on 2 of the model's 4 trainable weights"),
    (clip_before_backward, "clip-outside", ClippingError, "outside loss.backward()"),
    (clip_nonfinite, "clip-nonfinite", ClippingError, "error_if_nonfinite=True"),
    (clip_early_bound, "clip-early", ClippingError, ".grad"),
], ids=["some-weights", "outside-backward-step", "error_if_nonfinite", "bound-before-csrun"])
def test_clipping_the_device_cannot_run_is_refused_at_its_line(tmp_path: Path, clip: Callable[..., None], marker: str,
                                                               cls: type[UserError], words: str) -> None:
    """Part of the weights, before backward, error_if_nonfinite, torch's own function: refused naming the line."""
    assert EARLY_CLIP.__module__ == "torch.nn.utils.clip_grad"

    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        opt.zero_grad()
        clip(model, F.cross_entropy(model(x), y))
        opt.step()

    with pytest.raises(UserError) as info:
        run("embedded", tmp_path, body)
    assert isinstance(info.value, cls), repr(info.value)
    assert str(info.value).startswith(at_line(marker)), str(info.value)
    assert words in str(info.value)


# --------------------------------------------------------------------------------------------
# 3. a forward after optimizer.step()


@pytest.mark.parametrize("eval_mode", [True, False], ids=["eval", "train"])
def test_a_forward_after_the_update_sees_the_new_weights(tmp_path: Path, eval_mode: bool) -> None:
    """A no_grad forward after opt.step() (eval or train mode): its value, weights and BatchNorm buffers bitwise."""
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if eval_mode:
            model.eval()
        with torch.no_grad():
            val = F.cross_entropy(model(x), y)
        model.train()
        keep(out.losses, loss)
        keep(out.values, val)

    cpu, dev = both(tmp_path, body, model=lambda: Classifier(batch_norm=True))
    assert_bitwise(cpu, dev)
    assert dev.values != dev.losses  # the second forward saw other weights
    tracked = dev.state["bn.num_batches_tracked"].item()
    assert tracked == (STEPS if eval_mode else 2 * STEPS)
    assert not torch.equal(dev.state["bn.running_mean"], dev.initial["bn.running_mean"])


# --------------------------------------------------------------------------------------------
# 4. Python values the model branches on


def refused_at(tmp_path: Path, model: Callable[[], nn.Module], kind: type[BaseException], marker: str) -> None:
    """Training ``model`` on the device is refused with a ``kind`` located at the ``marker`` line."""
    with pytest.raises(Exception) as info:
        run("embedded", tmp_path, plain_step, model=model)
    problem = found(info.value, kind)
    assert problem is not None, repr(info.value)
    location = getattr(problem, "location", None)
    assert location is not None
    assert (location.filename, location.lineno) == (__file__, line_of(marker))


def test_a_forward_that_counts_in_python_is_refused_at_the_increment(tmp_path: Path) -> None:
    """self.step += 1 in forward (a Python int it branches on): ForwardChangesPythonState at that line."""
    refused_at(tmp_path, Counter, ForwardChangesPythonState, "counter")


def test_a_value_the_loop_sets_recompiles_with_one_notice(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """model.use_b = step >= 5 before the call: bitwise as the CPU path, one warning naming the loop's line."""
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        model.use_b = step >= 5  # L:use-b
        plain_step(step, model, opt, x, y, out)

    cpu = run(None, tmp_path, body, model=Switch)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="csrun.driver"):
        dev = run("embedded", tmp_path, body, model=Switch)
    assert_bitwise(cpu, dev)
    assert not torch.equal(dev.state["b.weight"], dev.initial["b.weight"])  # head b trained from step 5
    notices = [r for r in caplog.records if "use_b" in r.getMessage()]
    assert len(notices) == 1, [r.getMessage() for r in caplog.records]
    [notice] = notices
    assert notice.name == "csrun.driver" and notice.levelno == logging.WARNING
    assert "model.use_b changed (False -> True)" in notice.getMessage()
    assert f"{__file__}:{line_of('use-b')}" in notice.getMessage()


def test_a_value_switched_within_one_step_trains_bitwise(tmp_path: Path) -> None:
    """use_b False for the first call and True for the second, in every step."""
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        opt.zero_grad()
        model.use_b = False
        o1 = model(x)
        model.use_b = True
        o2 = model(x)
        loss = F.cross_entropy(o1, y) + 0.5 * F.cross_entropy(o2, y)
        loss.backward()
        opt.step()
        keep(out.losses, loss)

    cpu, dev = both(tmp_path, body, model=Switch)
    assert_bitwise(cpu, dev)
    for head in ("a.weight", "b.weight"):
        assert not torch.equal(dev.state[head], dev.initial[head]), head


def test_a_buffer_made_a_scalar_in_forward_is_refused_at_its_line(tmp_path: Path) -> None:
    """addcdiv(value=torch.where(buffer...)) reads a tensor as a number: TensorToScalar at the addcdiv line."""
    refused_at(tmp_path, Decay, TensorToScalar, "addcdiv")


# --------------------------------------------------------------------------------------------
# 5. steps without optimizer.step()


def test_a_forward_only_train_session_leaves_the_weights(tmp_path: Path) -> None:
    """model(x) and the loss alone: the device's weights stay, the global step is 0, losses as the CPU path's."""
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        keep(out.losses, F.cross_entropy(model(x), y))

    cpu, dev = both(tmp_path, body)
    assert_bitwise(cpu, dev)
    assert dev.global_step == 0
    for name, want in dev.initial.items():
        assert torch.equal(dev.state[name], want), name


def accumulate(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run,
               clip: bool = False) -> None:
    loss = F.cross_entropy(model(x), y)
    (loss / 4).backward()  # L:accum-backward
    if step % 4 == 3:
        if clip:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            keep(out.values, norm)
        opt.step()
        opt.zero_grad()
    keep(out.losses, loss)


def adam(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(m.parameters(), lr=0.01)


def test_gradient_accumulation_in_pipelined_mode_is_refused_at_the_backward(tmp_path: Path) -> None:
    """(loss / 4).backward() every batch, opt.step() every 4th: GradientAccumulation at the backward line."""
    with pytest.raises(GradientAccumulation) as info:
        run("embedded", tmp_path, accumulate)
    assert str(info.value).startswith(at_line("accum-backward")), str(info.value)
    assert "gradient accumulation" in str(info.value)


@pytest.mark.parametrize("clip", [False, True], ids=["plain", "clipped"])
def test_gradient_accumulation_in_weight_streaming_trains_bitwise(tmp_path: Path, clip: bool) -> None:
    """The same accumulation loop with weight streaming (Adam; clip_grad_norm_ before the 4th step's update)."""
    settings = CompileSettings(mixed_precision=False, execution_strategy="weight_streaming")

    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        accumulate(step, model, opt, x, y, out, clip=clip)

    cpu, dev = both(tmp_path, body, optimizer=adam, settings=settings)
    assert_bitwise(cpu, dev)
    assert dev.global_step == STEPS // 4
    assert len(dev.values) == (STEPS // 4 if clip else 0)


def test_a_loop_that_never_zeroes_the_gradients_is_refused(tmp_path: Path) -> None:
    """backward onto the last update's gradients (no zero_grad ever): StepOrderError mentioning zero_grad."""
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # L:no-zero-grad
        opt.step()

    with pytest.raises(StepOrderError) as info:
        run("embedded", tmp_path, body)
    assert "zero_grad" in str(info.value)
    assert str(info.value).startswith(at_line("no-zero-grad")), str(info.value)


# --------------------------------------------------------------------------------------------
# 6. the verify check


def break_group_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken device: group 1 updates with 1.5 times its learning rate."""
    real = engine_optimizers.set_learning_rate

    def broken(optimizer: torch.optim.Optimizer, lr: Any) -> None:
        real(optimizer, lr)
        if len(optimizer.param_groups) > 1:
            optimizer.param_groups[1]["lr"] *= 1.5

    monkeypatch.setattr(engine_optimizers, "set_learning_rate", broken)


def test_verify_stops_a_device_that_differs_naming_the_weight_and_the_step_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On by default for the first step: DeviceDiffers names '1.weight' and the optimizer.step() line."""
    monkeypatch.delenv("CSRUN_VERIFY_STEPS", raising=False)
    break_group_one(monkeypatch)
    with pytest.raises(DeviceDiffers) as info:
        run("embedded", tmp_path, plain_step, optimizer=two_sgd_groups)
    assert "'1.weight'" in str(info.value), str(info.value)
    assert MARKS.at("plain-step") in str(info.value), str(info.value)


def test_verify_off_lets_the_broken_device_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CSRUN_VERIFY_STEPS=0: the same broken device runs to the end (and its weights do differ)."""
    monkeypatch.setenv("CSRUN_VERIFY_STEPS", "0")
    cpu = run(None, tmp_path, plain_step, optimizer=two_sgd_groups)
    break_group_one(monkeypatch)
    dev = run("embedded", tmp_path, plain_step, optimizer=two_sgd_groups)
    assert len(dev.losses) == STEPS and dev.losses[0] == cpu.losses[0]
    assert not torch.equal(dev.state["1.weight"], cpu.state["1.weight"])


def test_a_bad_verify_steps_value_is_refused_at_initialize(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CSRUN_VERIFY_STEPS=abc: initialize raises a UserError naming the variable."""
    monkeypatch.setenv("CSRUN_VERIFY_STEPS", "abc")
    state_mod.reset_for_tests()
    with pytest.raises(UserError, match="CSRUN_VERIFY_STEPS"):
        cbtorch.initialize("embedded", settings=F32, model_dir=str(tmp_path))


# --------------------------------------------------------------------------------------------
# 7. a failed Session, a caught read


def test_a_clone_made_in_a_failed_step_is_usable_in_eager_code_afterwards(tmp_path: Path) -> None:
    """keep = x.clone() inside a step that raises: afterwards eager torch can use it, gradients and all."""
    kept: list[torch.Tensor] = []

    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        kept.append(x.clone())
        plain_step(step, model, opt, x, y, out)
        raise RuntimeError("the script fails in its step")

    with pytest.raises(RuntimeError, match="the script fails in its step"):
        run("embedded", tmp_path, body)
    first = data().tensors[0][:8]
    torch.manual_seed(5)
    lin = nn.Linear(6, 3)
    twin = nn.Linear(6, 3)
    twin.load_state_dict(lin.state_dict())
    lin(kept[0]).sum().backward()
    twin(first).sum().backward()
    assert torch.equal(kept[0], first)
    assert lin.weight.grad is not None and torch.equal(lin.weight.grad, twin.weight.grad)


def test_a_caught_read_in_the_first_step_does_not_stop_later_steps(tmp_path: Path) -> None:
    """loss.detach().item() in step 0, its DeviceTensorReadError caught: all steps run, bitwise as the CPU path."""
    caught: list[str] = []

    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if step == 0:
            try:
                loss.detach().item()  # on the CPU path a number; on the device refused
            except DeviceTensorReadError as exc:
                caught.append(str(exc))
        keep(out.losses, loss)

    cpu = run(None, tmp_path, body)
    assert caught == []
    dev = run("embedded", tmp_path, body)
    assert len(caught) == 1
    assert_bitwise(cpu, dev)


def test_a_model_that_cannot_be_copied_trains_unchecked_with_a_notice(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The check needs a copy of the model; one that refuses deepcopy trains on, with one notice."""
    class Uncopyable(Stack):
        def __deepcopy__(self, memo: dict) -> Any:
            raise TypeError("this model holds a handle that cannot be copied")

    with caplog.at_level(logging.WARNING, logger="csrun.driver"):
        dev = run("embedded", tmp_path, plain_step, model=lambda: Uncopyable(6, 8, 3))
    assert len(dev.losses) == STEPS
    notices = [r.getMessage() for r in caplog.records if "not checked" in r.getMessage()]
    assert len(notices) == 1 and "cannot be copied" in notices[0], notices
