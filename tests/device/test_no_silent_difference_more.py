"""Issue 30, continued: the patterns a review of the first change found still differing from
eager PyTorch, or refused at the wrong place, each now trained as eager or refused at its line."""

from __future__ import annotations

import copy
import io
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import csrun.torch as cbtorch
from csrun.compiler import CompileSettings
from csrun.compiler.errors import UnsupportedOptimizer
from csrun.driver.clipping import ClippingError
from csrun.driver.driver import DeviceUsageError
from csrun.driver.state_view import ReadAfterUpdate
from csrun.driver.verify import DeviceDiffers
from csrun.emulator.engine import executor as engine_mod
from csrun.program.errors import SpecError
from csrun.program.step_plan import StepPlan
from csrun.program.optimizer_classes import build_optimizer
from csrun.torch import amp as cbtorch_amp
from csrun.torch import process_state as state_mod

from .same_as_eager import (
    MARKS, STEPS, Marks, Run, Stack, Switch, assert_bitwise, both, data, keep, plain_step, run, two_sgd_groups,
)

pytestmark = pytest.mark.timeout(120)

at_line = Marks(__file__).at

MIXED = CompileSettings()  # the system's default: float16 compute, float32 weights


def test_a_forward_after_the_update_in_mixed_precision_trains_as_the_cpu_path(tmp_path: Path) -> None:
    """The program cut at the update reads the 16-bit weights the engine rounds (it once read stale ones)."""
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        with torch.no_grad():
            keep(out.values, F.cross_entropy(model(x), y))
        keep(out.losses, loss)

    cpu, dev = both(tmp_path, body, settings=MIXED)
    assert len(set(dev.losses)) > 1, dev.losses  # it trains
    assert dev.losses == pytest.approx(cpu.losses, rel=1e-2) and dev.values == pytest.approx(cpu.values, rel=1e-2)


def test_the_first_steps_check_sees_the_scripts_learning_rates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A device that gives every group group 0's rate is caught at the first step: the check takes
    the rates the script's optimizer had at optimizer.step(), not the device's."""
    real = engine_mod.Engine._rates

    def group_zeros_rate(self: Any, step: int, plan: StepPlan = StepPlan()) -> Any:
        rates = real(self, step, plan)
        return [rates[0]] * len(rates) if isinstance(rates, list) else rates

    monkeypatch.setattr(engine_mod.Engine, "_rates", group_zeros_rate)
    with pytest.raises(DeviceDiffers, match=r"'1\.weight'"):
        run("embedded", tmp_path, plain_step, optimizer=two_sgd_groups)


def test_a_group_whose_first_weight_is_frozen_keeps_its_rate(tmp_path: Path) -> None:
    """The device's group for a user group is found by any weight it updates (its first may be frozen)."""
    def frozen_first(m: nn.Module) -> torch.optim.Optimizer:
        m[1].weight.requires_grad_(False)
        return torch.optim.SGD([{"params": m[0].parameters(), "lr": 0.1},
                                {"params": [m[1].weight, m[1].bias], "lr": 0.5}], lr=0.1)

    cpu, dev = both(tmp_path, plain_step, optimizer=frozen_first)
    assert_bitwise(cpu, dev)
    assert dev.lrs == [0.1, 0.5]


def test_the_weights_read_after_optimizer_step_in_the_step_are_refused(tmp_path: Path) -> None:
    """Eager would show the updated weights; they exist on the device once the step has run."""
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        plain_step(step, model, opt, x, y, out)
        out.values.append(float(model[0].weight.norm()))  # L:read-after-step

    with pytest.raises(ReadAfterUpdate) as info:
        run("embedded", tmp_path, body)
    assert str(info.value).startswith(at_line("read-after-step"))
    cpu = run(None, tmp_path, body)  # the CPU path reads them as eager does
    assert len(cpu.values) == STEPS


def test_clipping_loss_scaled_gradients_is_refused_and_unscaled_ones_train(tmp_path: Path) -> None:
    """Eager clips what the scaler left: the scaled gradients without unscale_(), which the device never has."""
    def body(unscale: bool) -> Any:
        def step_body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
            scaler = out.extra.setdefault("scaler", cbtorch_amp.GradScaler(loss_scale=128.0))
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            if unscale:
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)  # L:scaled-clip
            scaler.step(opt)
            scaler.update()
            keep(out.losses, loss)
        return step_body

    with pytest.raises(ClippingError, match="loss-scaled gradients") as info:
        run("embedded", tmp_path, body(unscale=False))
    assert str(info.value).startswith(at_line("scaled-clip"))
    cpu, dev = both(tmp_path, body(unscale=True))
    assert_bitwise(cpu, dev)


def test_clipping_over_weights_the_optimizer_does_not_update_is_refused(tmp_path: Path) -> None:
    """Eager keeps adding up those weights' gradients (zero_grad does not clear them) and counts them."""
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)  # L:unheld-clip
        opt.step()

    with pytest.raises(ClippingError, match="does not update") as info:
        run("embedded", tmp_path, body, optimizer=lambda m: torch.optim.SGD(m[1].parameters(), lr=0.1))
    assert str(info.value).startswith(at_line("unheld-clip"))


def test_hooks_the_device_would_leave_out_are_refused(tmp_path: Path) -> None:
    """A gradient hook on a weight and an optimizer step hook run Python the program does not hold."""
    def hooked_weight(m: nn.Module) -> torch.optim.Optimizer:
        m[0].weight.register_hook(lambda g: g.clamp(-0.01, 0.01))
        return torch.optim.SGD(m.parameters(), lr=0.1)

    with pytest.raises(DeviceUsageError, match="gradient hook on the weight '0.weight'"):
        run("embedded", tmp_path, plain_step, optimizer=hooked_weight)

    def hooked_optimizer(m: nn.Module) -> torch.optim.Optimizer:
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        opt.register_step_post_hook(lambda *a: None)
        return opt

    with pytest.raises(DeviceUsageError, match="step hooks") as info:
        run("embedded", tmp_path, plain_step, optimizer=hooked_optimizer)
    assert str(info.value).startswith(MARKS.at("plain-step"))


def test_sgd_with_dampening_is_refused(tmp_path: Path) -> None:
    """torch starts the momentum from the first gradient undamped; the system's state exists before it."""
    with pytest.raises(Exception) as info:
        run("embedded", tmp_path, plain_step,
            optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, dampening=0.5))
    assert "dampening" in str(info.value) and isinstance(info.value, (UnsupportedOptimizer, Exception))


def test_a_tensor_attribute_the_loop_assigns_recompiles(tmp_path: Path) -> None:
    """A small tensor attribute (a temperature) is baked into the program: a new one recompiles."""
    class Tempered(Stack):
        def __init__(self) -> None:
            super().__init__(6, 16, 3)
            self.temperature = torch.tensor(1.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) / self.temperature

    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        model.temperature = torch.tensor(1.0 + 0.5 * step)
        plain_step(step, model, opt, x, y, out)

    cpu, dev = both(tmp_path, body, model=Tempered)
    assert_bitwise(cpu, dev)


def test_the_learning_rates_read_back_are_the_schedulers_next_as_in_eager(tmp_path: Path) -> None:
    """After the Session the optimizer shows the rate torch's scheduler set last (not the device's last used)."""
    cpu, dev = both(tmp_path, plain_step, optimizer=two_sgd_groups,
                    scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS))
    assert_bitwise(cpu, dev)
    assert dev.lrs[0] == pytest.approx(0.0, abs=1e-12)


def test_a_program_loaded_again_is_not_checked_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag that switches back and forth reloads a program each step; each program is checked once."""
    from csrun.driver import verify

    checks: list[int] = []
    real = verify.StepCheck.finish
    monkeypatch.setattr(verify.StepCheck, "finish", lambda self, *a: checks.append(1) or real(self, *a))

    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        model.use_b = step % 2 == 1
        plain_step(step, model, opt, x, y, out)

    cpu, dev = both(tmp_path, body, model=Switch)
    assert_bitwise(cpu, dev)
    assert len(checks) == 2


def test_a_step_plan_from_the_wire_is_checked_like_any_message() -> None:
    for bad in ({"gradient_norm_type": None}, {"max_gradient_norm": 10 ** 400},
                {"max_gradient_norm": 1.0, "max_gradient_value": 1.0}):
        with pytest.raises(SpecError, match="step plan"):
            StepPlan.from_json(bad)


def test_a_param_group_naming_a_weight_the_program_lacks_is_refused() -> None:
    w = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(SpecError, match="typo"):
        build_optimizer("sgd", {}, [("w", w)], lr=[0.1], param_groups=[{"params": ["w", "typo"]}])


def test_the_cpu_run_leaves_the_model_as_it_is(tmp_path: Path) -> None:
    """The CPU run's watch of the first forwards uses torch's global hooks: the model copies and pickles."""
    state_mod.reset_for_tests()
    cbtorch.initialize(None, settings=CompileSettings(mixed_precision=False))
    model = cbtorch.module(Stack(6, 16, 3))
    torch.save(model, io.BytesIO())
    snapshot = copy.deepcopy(model)
    x = data(8).tensors[0]
    with torch.no_grad():
        model[0].weight.add_(1.0)
        assert not torch.equal(snapshot(x), model(x))


def test_a_changed_keyword_is_named_in_the_refusal(tmp_path: Path) -> None:
    class Keyed(Stack):
        def __init__(self) -> None:
            super().__init__(6, 16, 3)

        def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:  # type: ignore[override]
            return super().forward(x) * scale

    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        opt.zero_grad()
        F.cross_entropy(model(x, scale=1.0 + step), y).backward()  # L:keyword
        opt.step()

    with pytest.raises(Exception, match=r"scale=2\.0.*compiled: model\(input0, scale=1\.0\)") as info:
        run("embedded", tmp_path, body, model=Keyed)
    assert str(info.value).startswith(at_line("keyword"))


def test_the_recompile_notice_comes_once_per_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        model.use_b = step % 2 == 1  # L:alternate
        plain_step(step, model, opt, x, y, out)

    with caplog.at_level(logging.WARNING, logger="csrun.driver"):
        run("embedded", tmp_path, body, model=Switch)
    notices = [r.getMessage() for r in caplog.records if "compiled again" in r.getMessage()]
    assert len(notices) == 1 and notices[0].startswith(at_line("alternate")), notices
