"""torch LR schedulers on a wrapped optimizer run on the device with eager torch's learning rate at every step."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as S
from torch.utils.data import DataLoader, TensorDataset

import csrun.torch as cbtorch
from csrun.compiler import CompileSettings
from csrun.compiler.errors import LRSchedulerNotSupported
from csrun.driver.steps import StepOrderError
from csrun.torch import process_state as state_mod
from tests.compiler.helpers import LR_SCHEDULERS

pytestmark = pytest.mark.timeout(120)

STEPS = 50


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8 * STEPS, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


def run(cs_ip: str | None, model_dir: str, make: Callable[[Any], Any], *, before_wrap: bool = False,
        step_scheduler: Callable[[Any, Any], None] | None = None) -> tuple[list[float], torch.Tensor]:
    """A regression loop with ``make(optimizer)`` as its scheduler; the learning rate the optimizer
    shows in each step's closure (after ``scheduler.step()``: the next step's, as in eager)."""
    state_mod.reset_for_tests()
    torch.manual_seed(0)
    cbtorch.initialize(cs_ip, settings=CompileSettings(mixed_precision=False), model_dir=model_dir)
    model = cbtorch.module(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = make(optimizer) if before_wrap else None
    optimizer = cbtorch.optimizer(optimizer)
    if scheduler is None:
        scheduler = make(optimizer)
    loader = cbtorch.dataloader(DataLoader(data(), batch_size=8, drop_last=True))
    lrs: list[float] = []
    with cbtorch.Session(loader):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            (step_scheduler or (lambda s, o: s.step()))(scheduler, optimizer)
            cbtorch.add_step_closure(lambda: lrs.append(cbtorch.get_state()["optimizer"]["param_groups"][0]["lr"]))
    return lrs, model.weight.detach().clone()


def eager_lrs(make: Callable[[Any], Any]) -> list[float]:
    """The learning rate eager torch's optimizer shows after each step's ``scheduler.step()``."""
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.05)
    scheduler = make(opt)
    out = []
    for _ in range(STEPS):
        opt.step()
        scheduler.step()
        out.append(opt.param_groups[0]["lr"])
    return out


@pytest.mark.parametrize("name", sorted(LR_SCHEDULERS))
def test_device_learning_rate_equals_eager_torch_at_every_step(tmp_path: Path, name: str) -> None:
    make = LR_SCHEDULERS[name]
    lrs, weight = run("embedded", str(tmp_path / "dev"), make)
    assert lrs == pytest.approx(eager_lrs(make), rel=1e-6, abs=1e-12)
    _, cpu_weight = run(None, str(tmp_path / "cpu"), make)
    assert torch.allclose(weight, cpu_weight, atol=1e-5)


def test_a_scheduler_built_before_wrapping_counts_too(tmp_path: Path) -> None:
    make = LR_SCHEDULERS["StepLR"]
    lrs, _ = run("embedded", str(tmp_path), make, before_wrap=True)
    assert lrs == pytest.approx(eager_lrs(make), rel=1e-6)


@pytest.mark.parametrize("make", [lambda o: S.LambdaLR(o, lambda s: 0.99**s), lambda o: S.ReduceLROnPlateau(o)])
def test_schedulers_the_device_cannot_run_are_refused_when_built(tmp_path: Path, make: Callable[[Any], Any]) -> None:
    state_mod.reset_for_tests()
    cbtorch.initialize("embedded", settings=CompileSettings(mixed_precision=False), model_dir=str(tmp_path))
    model = cbtorch.module(nn.Linear(4, 1))
    optimizer = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    with pytest.raises(LRSchedulerNotSupported) as info:
        make(optimizer)
    assert "StepLR" in info.value.render()


@pytest.mark.parametrize("misuse,match", [
    (lambda s, o: (s.step(), s.step()), "twice in one step"),
    (lambda s, o: None, "without lr_scheduler.step"),
])
def test_scheduler_steps_are_checked_for_order(tmp_path: Path, misuse: Callable[[Any, Any], None], match: str) -> None:
    with pytest.raises(StepOrderError, match=match):
        run("embedded", str(tmp_path), LR_SCHEDULERS["ExponentialLR"], step_scheduler=misuse)


def test_a_scheduler_step_before_the_optimizer_step_is_refused(tmp_path: Path) -> None:
    state_mod.reset_for_tests()
    cbtorch.initialize("embedded", settings=CompileSettings(mixed_precision=False), model_dir=str(tmp_path))
    model = cbtorch.module(nn.Linear(4, 1))
    optimizer = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    scheduler = S.StepLR(optimizer, 5)
    loader = cbtorch.dataloader(DataLoader(data(), batch_size=8, drop_last=True))
    with pytest.raises(StepOrderError, match="before optimizer.step"):
        with cbtorch.Session(loader):
            for x, y in loader:
                nn.functional.mse_loss(model(x), y).backward()
                scheduler.step()
                optimizer.step()
