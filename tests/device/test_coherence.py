"""Issue 44: every change a script makes between steps reaches the device, and each ordinary pattern
either trains as eager PyTorch (compared bit for bit with the CPU path, float32) or is refused at its
line with its true reason (:mod:`csrun.driver.coherence`, :mod:`csrun.driver.random_draws`,
:mod:`csrun.driver.autograd_calls`, :mod:`csrun.compiler.python_globals`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.utils.checkpoint as checkpointing
from torch import nn
from torch.nn import functional as F

import csrun.torch as cbtorch
from csrun.compiler.errors import CumulativeBatchNorm
from csrun.compiler.python_globals import ForwardChangesPythonGlobal
from csrun.driver.autograd_calls import CustomBackward, NestedGradient
from csrun.driver.clipping import ClippingError
from csrun.driver.coherence import HostEditError, TrainableSetChanged

from .same_as_eager import MARKS, STEPS, Marks, Run, Stack, assert_bitwise, both, found, keep, plain_step, run

pytestmark = pytest.mark.timeout(120)

at_line = Marks(__file__).at
Body = Callable[[int, nn.Module, Any, torch.Tensor, torch.Tensor, Run], None]


def adamw(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(m.parameters(), lr=0.01)


def adam(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(m.parameters(), lr=0.01)


def with_groups(**per_step: Callable[[int], Any]) -> Body:
    """A plain step after setting each named hyperparameter of every group to ``per_step[key](step)``."""
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        for group in opt.param_groups:
            for key, value in per_step.items():
                group[key] = value(step)
        plain_step(step, model, opt, x, y, out)
    return body


# -- 1. hyperparameters set by hand between steps ---------------------------------------------

@pytest.mark.parametrize("body, optimizer", [
    (with_groups(lr=lambda s: 0.02 * min(1.0, (s + 1) / 4)), None),  # a hand-written warm-up
    (with_groups(weight_decay=lambda s: 0.05 * s), adamw),
    (with_groups(momentum=lambda s: 0.5 if s > 3 else 0.9), None),
    (with_groups(betas=lambda s: (0.8, 0.99) if s > 3 else (0.9, 0.999)), adam),
    (with_groups(lr=lambda s: 0.01 / (s + 1), eps=lambda s: 1e-8 * (s + 1)), adam),
], ids=["lr-warmup", "weight-decay", "momentum", "betas", "lr-and-eps"])
def test_hyperparameters_set_by_hand_reach_each_update(tmp_path: Path, body: Body, optimizer: Any) -> None:
    kw = {"optimizer": optimizer} if optimizer is not None else {}
    cpu, dev = both(tmp_path, body, **kw)
    assert_bitwise(cpu, dev)  # the lrs the optimizer shows after the run too: the device's own


def test_a_tensor_learning_rate_trains_bit_for_bit(tmp_path: Path) -> None:
    cpu, dev = both(tmp_path, plain_step, optimizer=lambda m: torch.optim.Adam(m.parameters(), lr=torch.tensor(1e-2)))
    assert_bitwise(cpu, dev)


@pytest.mark.parametrize("cls", [torch.optim.NAdam, torch.optim.RAdam])
def test_decoupled_weight_decay_is_computed(tmp_path: Path, cls: type) -> None:
    cpu, dev = both(tmp_path, plain_step,
                    optimizer=lambda m: cls(m.parameters(), lr=0.01, weight_decay=0.1, decoupled_weight_decay=True))
    assert_bitwise(cpu, dev)


# -- 2. weights edited on the host between steps ----------------------------------------------

def clamp_data(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    for p in model.parameters():  # WGAN's weight clipping
        p.data.clamp_(-0.1, 0.1)
    plain_step(step, model, opt, x, y, out)


def zero_a_row(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    if step % 3 == 1:
        with torch.no_grad():
            model[0].weight[0].zero_()
    plain_step(step, model, opt, x, y, out)


def clamp_in_a_closure(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    plain_step(step, model, opt, x, y, out)

    def clamp() -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.clamp_(-0.05, 0.05)
    cbtorch.add_step_closure(clamp)


@pytest.mark.parametrize("body", [clamp_data, zero_a_row, clamp_in_a_closure], ids=["data-clamp", "row", "closure"])
def test_weights_edited_between_steps_train_as_edited(tmp_path: Path, body: Body) -> None:
    cpu, dev = both(tmp_path, body)
    assert_bitwise(cpu, dev)


def test_an_edit_after_the_last_step_is_in_the_state_taken(tmp_path: Path) -> None:
    """An edit no step follows still reaches the device before its state is read (a checkpoint)."""
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        plain_step(step, model, opt, x, y, out)
        if step == STEPS - 1:
            cbtorch.add_step_closure(lambda: model[1].bias.data.fill_(0.5))

    cpu, dev = both(tmp_path, body)
    assert_bitwise(cpu, dev)
    assert torch.equal(dev.state["1.bias"], torch.full((3,), 0.5))


def test_an_edit_of_a_stale_copy_is_refused(tmp_path: Path) -> None:
    """A reference kept from before training is edited without reading the model: eager would edit
    the trained value, which the host copy does not hold."""
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        if step == 0:
            out.extra["kept"] = model[0].weight
        kept = out.extra["kept"]
        if step == 2:
            with torch.no_grad():
                kept.mul_(0.5)
        plain_step(step, model, opt, x, y, out)

    with pytest.raises(HostEditError, match="'0.weight'.*out of date"):
        run("embedded", tmp_path, body)
    run(None, tmp_path, body)  # eager runs it


def test_an_edit_during_the_step_is_refused(tmp_path: Path) -> None:
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        with torch.no_grad():
            model[1].bias.zero_()  # between the forward and the update
        loss.backward()
        opt.step()

    with pytest.raises(HostEditError, match="'1.bias'.*during the step"):
        run("embedded", tmp_path, body)


# -- 3. the trainable set changing mid-run ----------------------------------------------------

def frozen_first(m: nn.Module) -> torch.optim.Optimizer:
    m[0].requires_grad_(False)
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def unfreeze_at_3(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    if step == 3:
        model[0].requires_grad_(True)  # L:unfreeze
    plain_step(step, model, opt, x, y, out)


def add_group_at_3(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    if step == 3:
        opt.add_param_group({"params": model[0].parameters(), "lr": 0.05})  # L:add-group
    plain_step(step, model, opt, x, y, out)


@pytest.mark.parametrize("body, optimizer, marker", [
    (unfreeze_at_3, frozen_first, "unfreeze"),
    (add_group_at_3, lambda m: torch.optim.SGD(m[1].parameters(), lr=0.1), "add-group"),
], ids=["unfreeze", "add-param-group"])
def test_a_new_trainable_set_recompiles_with_one_notice_naming_its_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, body: Body, optimizer: Any, marker: str) -> None:
    cpu = run(None, tmp_path, body, optimizer=optimizer)
    with caplog.at_level(logging.WARNING, logger="csrun.driver"):
        dev = run("embedded", tmp_path, body, optimizer=optimizer)
    assert_bitwise(cpu, dev)
    notices = [r.getMessage() for r in caplog.records if "compiled again for the new set" in r.getMessage()]
    assert len(notices) == 1 and notices[0].startswith(at_line(marker)), notices
    assert "'0.weight'" in notices[0] or "param groups" in notices[0]


def test_the_trainable_set_changed_during_a_step_is_refused(tmp_path: Path) -> None:
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        if step == 2:
            model[0].requires_grad_(False)  # L:mid-freeze
        loss.backward()
        opt.step()

    with pytest.raises(TrainableSetChanged) as info:
        run("embedded", tmp_path, body)
    assert str(info.value).startswith(at_line("mid-freeze"))


# -- 4. zero_grad(set_to_none=False) ------------------------------------------------------------

class TwoHeads(nn.Module):
    """Head ``b`` is used on odd steps only (a Python flag: two programs); with the zero gradients
    ``zero_grad(set_to_none=False)`` keeps, Adam still moves it on the even steps, as in eager."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 3), nn.Linear(6, 3)
        self.use_b = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(x) if self.use_b else self.a(x)


@pytest.mark.parametrize("set_to_none", [False, True])
def test_zero_grad_keeping_zero_gradients_trains_as_eager(tmp_path: Path, set_to_none: bool) -> None:
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        model.use_b = step % 2 == 1
        opt.zero_grad(set_to_none=set_to_none)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        keep(out.losses, loss)

    cpu, dev = both(tmp_path, body, model=TwoHeads, optimizer=adam)
    assert_bitwise(cpu, dev)


# -- 5. a batch changed between two model calls -------------------------------------------------

def teacher_then_student(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    opt.zero_grad()
    with torch.no_grad():
        target = model(x).softmax(-1)
    x.add_(0.5)  # the second call sees the changed batch, the first did not
    x[:, 0] = 3.0
    loss = F.mse_loss(model(x).softmax(-1), target) + F.cross_entropy(model(x * 2), y)
    loss.backward()
    opt.step()
    keep(out.losses, loss)


def test_a_batch_changed_between_two_calls_gives_each_its_own_value(tmp_path: Path) -> None:
    cpu, dev = both(tmp_path, teacher_then_student)
    assert_bitwise(cpu, dev)


# -- 6. random numbers ------------------------------------------------------------------------

class Dropped(Stack):
    def __init__(self) -> None:
        super().__init__(6, 16, 3)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.tanh(self[0](x)))
        h = F.scaled_dot_product_attention(h[:, None, None, :], h[:, None, None, :], h[:, None, None, :],
                                           dropout_p=0.2)[:, 0, 0]
        return self[1](h) + 0.01 * torch.randn_like(self[1](h))


def augmented(closures: bool) -> Body:
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        x = x + 0.1 * torch.randn_like(x)  # host augmentation, between the device's draws
        opt.zero_grad()
        loss = F.cross_entropy(F.dropout(model(x), 0.1), y)
        loss.backward()
        opt.step()
        if closures:
            keep(out.losses, loss)
    return body


@pytest.mark.parametrize("closures", [True, False], ids=["closures", "no-closures"])
def test_dropout_with_host_augmentation_is_eagers_run_after_run(tmp_path: Path, closures: bool) -> None:
    cpu = run(None, tmp_path, augmented(closures), model=Dropped)
    runs = [run("embedded", tmp_path / str(i), augmented(closures), model=Dropped) for i in range(3)]
    for dev in runs:
        assert_bitwise(cpu, dev, steps=STEPS if closures else 0)


# -- 7. the script's own autocast ---------------------------------------------------------------

def under_autocast(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    loss = F.cross_entropy(logits.float(), y)
    loss.backward()
    opt.step()
    keep(out.losses, loss)


def test_the_scripts_autocast_is_honoured(tmp_path: Path) -> None:
    cpu, dev = both(tmp_path, under_autocast)
    assert_bitwise(cpu, dev)
    plain = run("embedded", tmp_path / "plain", plain_step)
    assert plain.losses != dev.losses  # bfloat16 computed, not float32


# -- 8. Python globals and closure variables the forward reads ------------------------------------

DOUBLE = False
COUNT = 0


class ReadsAGlobal(Stack):
    def __init__(self) -> None:
        super().__init__(6, 16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out * 2 if DOUBLE else out


class CountsInAGlobal(Stack):
    def __init__(self) -> None:
        super().__init__(6, 16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global COUNT
        COUNT += 1  # L:count
        return super().forward(x) if COUNT < 4 else super().forward(x) * 2


def flip(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    global DOUBLE
    DOUBLE = step >= 4
    plain_step(step, model, opt, x, y, out)


def closure_model() -> tuple[nn.Module, Callable[[float], None]]:
    scale = [1.0]

    class Scaled(Stack):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * factor

    factor = 1.0

    def set_factor(value: float) -> None:
        nonlocal factor
        factor = value
        scale[0] = value

    return Scaled(6, 16, 3), set_factor


def test_a_global_the_forward_reads_recompiles_when_the_loop_changes_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    global DOUBLE
    DOUBLE = False
    cpu = run(None, tmp_path, flip, model=ReadsAGlobal)
    DOUBLE = False
    with caplog.at_level(logging.WARNING, logger="csrun.driver"):
        dev = run("embedded", tmp_path, flip, model=ReadsAGlobal)
    assert_bitwise(cpu, dev)
    assert any("DOUBLE changed (False -> True)" in r.getMessage() for r in caplog.records)


def test_a_closure_variable_the_forward_reads_recompiles_too(tmp_path: Path) -> None:
    made: dict[str, Any] = {}

    def model() -> nn.Module:
        made["model"], made["set"] = closure_model()
        return made["model"]

    def body(step: int, m: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        made["set"](1.0 + (step >= 5))
        plain_step(step, m, opt, x, y, out)

    cpu, dev = both(tmp_path, body, model=model)
    assert_bitwise(cpu, dev)


def test_a_forward_that_counts_in_a_global_is_refused_at_the_increment(tmp_path: Path) -> None:
    global COUNT
    COUNT = 0
    with pytest.raises(Exception) as info:
        run("embedded", tmp_path, plain_step, model=CountsInAGlobal)
    problem = found(info.value, ForwardChangesPythonGlobal)
    assert problem is not None and str(problem).startswith(at_line("count")), info.value
    assert COUNT == 1  # run once, as eager's first step; the compile's trace put it back


TALLY = [0]


class CountsInAGlobalList(Stack):
    def __init__(self) -> None:
        super().__init__(6, 16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        TALLY[0] += 1  # changed in place: no assignment to hear
        return super().forward(x) if TALLY[0] < 4 else super().forward(x) * 2


def test_a_forward_that_counts_in_a_global_list_is_refused(tmp_path: Path) -> None:
    """Not compiled again at every step (the guard saw its own change): refused, as the integer is."""
    TALLY[0] = 0
    with pytest.raises(Exception) as info:
        run("embedded", tmp_path, plain_step, model=CountsInAGlobalList)
    problem = found(info.value, ForwardChangesPythonGlobal)
    assert problem is not None and "TALLY each call ([1] -> [2])" in str(problem), info.value
    assert TALLY == [1]


# -- 10. autograd the script drives -------------------------------------------------------------

class Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * 3


class WithCustomBackward(Stack):
    def __init__(self) -> None:
        super().__init__(6, 16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self[1](torch.tanh(Doubled.apply(self[0](x))))  # L:custom


class Reentrant(Stack):
    def __init__(self) -> None:
        super().__init__(6, 16, 16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self[0](x))
        h = checkpointing.checkpoint(lambda t: torch.tanh(self[1](t)), h, use_reentrant=True)
        on_input = checkpointing.checkpoint(lambda t: self[0](t), x, use_reentrant=True)  # no gradient flows here
        return self[2](h) + on_input[:, :3]


def test_a_custom_backward_is_refused_at_its_apply(tmp_path: Path) -> None:
    with pytest.raises(CustomBackward) as info:
        run("embedded", tmp_path, plain_step, model=WithCustomBackward)
    assert str(info.value).startswith(at_line("custom")) and "Doubled" in str(info.value)


def test_reentrant_checkpointing_trains_as_eager(tmp_path: Path) -> None:
    cpu, dev = both(tmp_path, plain_step, model=Reentrant)
    assert_bitwise(cpu, dev)


class PenalisedInside(Stack):
    """A forward that differentiates inside itself (a gradient penalty on a hidden activation)."""

    def __init__(self) -> None:
        super().__init__(6, 16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self[0](x)
        grad = torch.autograd.grad(h.sum(), h, create_graph=True)[0]  # L:penalty
        return self[1](torch.tanh(h)) + grad.mean()


def test_a_gradient_penalty_is_refused_at_its_line(tmp_path: Path) -> None:
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        opt.zero_grad()
        xi = x.clone().requires_grad_(True)  # L:input-penalty
        logits = model(xi)
        grad = torch.autograd.grad(logits.sum(), xi, create_graph=True)[0]
        (F.cross_entropy(logits, y) + grad.norm()).backward()
        opt.step()

    with pytest.raises(Exception) as info:  # on the inputs: refused where they ask for gradients
        run("embedded", tmp_path, body)
    assert str(info.value).startswith(at_line("input-penalty")), info.value
    with pytest.raises(NestedGradient) as nested:  # inside the forward
        run("embedded", tmp_path / "inside", plain_step, model=PenalisedInside)
    assert str(nested.value).startswith(at_line("penalty"))


# -- refusals with their true reason ------------------------------------------------------------

def torch_scaler(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    scaler = out.extra.setdefault("scaler", torch.amp.GradScaler("cpu"))
    opt.zero_grad()
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    scaler.step(opt)  # L:torch-scaler
    scaler.update()


def second_optimizer(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    other = out.extra.setdefault("other", torch.optim.SGD(model[0].parameters(), lr=0.1))
    opt.zero_grad()
    other.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    other.step()  # L:second-optimizer


@pytest.mark.parametrize("body, marker, reason, optimizer", [
    (torch_scaler, "torch-scaler", "torch.amp.GradScaler", None),
    (second_optimizer, "second-optimizer", "a second optimizer", lambda m: torch.optim.SGD(m[1].parameters(), lr=0.1)),
], ids=["torch-grad-scaler", "second-optimizer"])
def test_refusals_give_their_true_reason(tmp_path: Path, body: Body, marker: str, reason: str, optimizer: Any) -> None:
    with pytest.raises(ClippingError) as info:
        run("embedded", tmp_path, body, **({"optimizer": optimizer} if optimizer else {}))
    assert str(info.value).startswith(at_line(marker)) and reason in str(info.value)


class CumulativeNorm(Stack):
    def __init__(self) -> None:
        super().__init__(6, 16, 3)
        self.norm = nn.BatchNorm1d(16, momentum=None)  # L:cumulative-norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self[1](torch.tanh(self.norm(self[0](x))))


def test_a_cumulative_batch_norm_is_refused_at_the_modules_line(tmp_path: Path) -> None:
    with pytest.raises(Exception) as info:
        run("embedded", tmp_path, plain_step, model=CumulativeNorm)
    problem = found(info.value, CumulativeBatchNorm)
    assert problem is not None and str(problem).startswith(at_line("cumulative-norm")), info.value
    assert "data-dependent" not in str(info.value)


def test_the_harness_marks_are_where_refusals_point() -> None:
    assert MARKS.line("plain-step") > 0


# -- over the wire: cs_emulator -------------------------------------------------------------------

def everything_at_once(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    for group in opt.param_groups:
        group["lr"] = 0.02 * min(1.0, (step + 1) / 4)
    for p in model.parameters():
        p.data.clamp_(-0.4, 0.4)
    augmented(closures=True)(step, model, opt, x, y, out)


def test_the_same_changes_reach_a_cs_emulator_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-step hyperparameters, host edits and host-drawn random inputs cross the wire as they reach
    the embedded device."""
    from csrun.emulator.remote.server import EmulatorServer

    cpu = run(None, tmp_path, everything_at_once, model=Dropped)  # first: torch's lazy imports before the
    monkeypatch.setenv("CSRUN_EMULATOR_TOKEN", "coherence-test-token")  # server's warm-up thread imports
    server = EmulatorServer(token="coherence-test-token", port=0)
    server.start()
    try:
        remote = run(f"127.0.0.1:{server.address[1]}", tmp_path / "remote", everything_at_once, model=Dropped)
    finally:
        server.shutdown()
    assert_bitwise(cpu, remote)


# -- the hidden probes' patterns (a second round) ------------------------------------------------

def mean_teacher(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    """A teacher made with copy.deepcopy, run in the loop and EMA-updated in a step closure."""
    import copy
    if step == 0:
        out.extra["teacher"] = copy.deepcopy(model)
    teacher = out.extra["teacher"]
    with torch.no_grad():
        soft = teacher(x).softmax(-1)
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y) + F.mse_loss(model(x).softmax(-1), soft)
    loss.backward()
    opt.step()
    keep(out.losses, loss)

    def ema() -> None:
        with torch.no_grad():
            for t, s in zip(teacher.parameters(), model.parameters()):
                t.mul_(0.9).add_(s, alpha=0.1)
    cbtorch.add_step_closure(ema)


class Attending(nn.Module):
    """nn.TransformerEncoderLayer (dropout 0.1 in its attention and feed-forward) and an
    nn.MultiheadAttention with dropout: their inner draws are the host's too."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(2, 8)
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        self.att = nn.MultiheadAttention(8, 2, batch_first=True, dropout=0.2)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layer(self.inp(x.view(-1, 3, 2)))
        a, _ = self.att(h, h, h, need_weights=False)
        return self.fc(a.mean(1))


def changes_the_model(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    """Structure changed between steps: a hook, a swapped activation, pruning (weight -> weight_orig)."""
    import torch.nn.utils.prune as prune
    if step == 2:
        model.register_forward_hook(lambda m, i, o: o * 0.5)
    if step == 4:
        prune.l1_unstructured(model[0], "weight", amount=0.3)
    plain_step(step, model, opt, x, y, out)


def changes_values_in_place(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    """A config namespace the forward reads, a class-weight tensor and the optimizer's state, each
    changed in place; a mixup coefficient made anew each step as a tensor."""
    if step == 3:
        model.cfg.scale = 2.0
        out.extra["weights"].mul_(1.5)
        opt.state.clear()  # restart Adam's moments, as eager does
    opt.zero_grad()
    lam = torch.tensor(0.25 + 0.05 * step)
    loss = lam * F.cross_entropy(model(x), y, weight=out.extra["weights"])
    loss.backward()
    opt.step()
    keep(out.losses, loss)
    cbtorch.add_step_closure(lambda: out.values.append(float(opt.state[next(iter(model.parameters()))]["exp_avg"].norm())))


class Configured(Stack):
    def __init__(self) -> None:
        super().__init__(6, 16, 3)
        import types
        self.cfg = types.SimpleNamespace(scale=1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * self.cfg.scale


def with_weights(make: Callable[[nn.Module], torch.optim.Optimizer]) -> Callable[[nn.Module], torch.optim.Optimizer]:
    def optimizer(m: nn.Module) -> torch.optim.Optimizer:
        return make(m)
    return optimizer


def freeze_then_unfreeze(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    if step == 2:
        model[1].bias.requires_grad_(False)
    if step == 4:
        model[1].bias.requires_grad_(True)  # its optimizer state comes back with it
    plain_step(step, model, opt, x, y, out)


@pytest.mark.parametrize("body, model, optimizer", [
    (mean_teacher, None, None),
    (plain_step, Attending, None),
    (changes_the_model, None, None),
    (freeze_then_unfreeze, None, adam),
], ids=["deepcopy-teacher", "transformer-dropout", "structure", "freeze-unfreeze"])
def test_probe_patterns_train_as_eager(tmp_path: Path, body: Body, model: Any, optimizer: Any) -> None:
    kw = {k: v for k, v in (("model", model), ("optimizer", optimizer)) if v is not None}
    cpu, dev = both(tmp_path, body, **kw)
    assert_bitwise(cpu, dev)


def test_values_changed_in_place_reach_the_device(tmp_path: Path) -> None:
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        out.extra.setdefault("weights", torch.ones(3))
        changes_values_in_place(step, model, opt, x, y, out)

    cpu, dev = both(tmp_path, body, model=Configured, optimizer=adam)
    assert_bitwise(cpu, dev)


def test_the_learning_rate_set_after_the_last_step_is_the_one_shown(tmp_path: Path) -> None:
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        plain_step(step, model, opt, x, y, out)
        if step == STEPS - 1:
            for group in opt.param_groups:
                group["lr"] = 0.01  # no step follows: eager's state_dict() shows it

    cpu, dev = both(tmp_path, body)
    assert_bitwise(cpu, dev)
    assert dev.lrs == [0.01]


def python_draw(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    plain_step(step, model, opt, x, y, out)


class LayerDrop(Stack):
    def __init__(self) -> None:
        super().__init__(6, 16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import random
        return self[1](torch.tanh(self[0](x))) if random.random() < 0.5 else self[1](self[0](x))


def twice_backward(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    opt.zero_grad()
    logits = model(x)
    F.cross_entropy(logits, y).backward(retain_graph=True)
    logits.sum().backward()  # L:twice
    opt.step()


def weighted_backward(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward(torch.tensor(0.5))  # L:gradient-arg
    opt.step()


def penalty_on_weights(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    opt.zero_grad()
    l2 = sum(p.pow(2).sum() for p in model.parameters())
    loss = F.cross_entropy(model(x), y) + 1e-3 * l2  # L:host-penalty
    loss.backward()
    opt.step()


def input_gradient(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    x.requires_grad_(True)  # L:fgsm
    plain_step(step, model, opt, x, y, out)


def closure_step(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    def again() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss
    again()
    opt.step(again)  # L:closure-step


@pytest.mark.parametrize("body, model, marker, reason", [
    (twice_backward, None, "twice", "twice in one step"),
    (weighted_backward, None, "gradient-arg", "gradient=..."),
    (penalty_on_weights, None, "host-penalty", "computed with autograd on the host"),
    (input_gradient, None, "fgsm", "gradients with respect to the inputs"),
    (closure_step, None, "closure-step", "optimizer.step(closure)"),
    (python_draw, LayerDrop, "plain-step", "draws Python random numbers"),
], ids=["two-backwards", "backward-gradient", "host-penalty", "input-gradient", "step-closure", "python-random"])
def test_what_the_device_cannot_run_is_refused_at_its_line(tmp_path: Path, body: Body, model: Any, marker: str,
                                                           reason: str) -> None:
    with pytest.raises(Exception) as info:
        run("embedded", tmp_path, body, **({"model": model} if model else {}))
    text = str(info.value)
    prefix = MARKS.at(marker) if marker == "plain-step" else at_line(marker)
    assert reason in text and (text.startswith(prefix) or marker == "plain-step"), text


def test_a_float64_model_is_refused_before_it_trains_float32(tmp_path: Path) -> None:
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        plain_step(step, model, opt, x.double(), y, out)

    run(None, tmp_path, body, model=lambda: Stack(6, 16, 3).double())  # eager trains it in float64
    with pytest.raises(Exception, match="not float32"):
        run("embedded", tmp_path, body, model=lambda: Stack(6, 16, 3).double())


def test_a_script_profiled_with_cprofile_trains_and_keeps_its_profile(tmp_path: Path) -> None:
    """The forward's watch (sys.setprofile) pauses a C profiler for the recorded call and gives it back."""
    import cProfile
    import sys

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        cpu, dev = both(tmp_path, plain_step)
        still_profiling = sys.getprofile() is not None
    finally:
        profiler.disable()
    assert_bitwise(cpu, dev)
    assert still_profiling
