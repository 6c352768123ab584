"""torch LR schedulers on a wrapped optimizer run on the host, as in eager PyTorch, and every update on
the device takes the learning rate they set: the same rates and weights as the CPU path, bit for bit."""

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
from csrun.torch import process_state as state_mod
from tests.compiler.helpers import LR_SCHEDULERS

pytestmark = pytest.mark.timeout(120)

STEPS = 50

HOST_ONLY: dict[str, Callable[[Any], Any]] = {
    "LambdaLR": lambda o: S.LambdaLR(o, lambda s: min(1.0, (s + 1) / 10) * 0.97 ** s),  # a warm-up, as HF's
    "MultiplicativeLR": lambda o: S.MultiplicativeLR(o, lambda s: 0.98),
    "OneCycleLR": lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=STEPS + 1),
    "CyclicLR": lambda o: S.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=7),
}
"""Schedulers that run Python on the host every step (the device once refused them)."""


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8 * STEPS, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


Stepper = Callable[[Any, int, Any], None]
"""How a loop steps its scheduler: ``(scheduler, step, loss)`` after ``optimizer.step()``."""


def every_step(scheduler: Any, step: int, loss: Any) -> None:
    scheduler.step()


def run(cs_ip: str | None, model_dir: str, make: Callable[[Any], Any], *, before_wrap: bool = False,
        stepper: Stepper = every_step, settings: CompileSettings = CompileSettings(mixed_precision=False),
        ) -> tuple[list[float], torch.Tensor]:
    """A regression loop with ``make(optimizer)`` as its scheduler; the learning rate the optimizer
    shows in each step's closure (after ``scheduler.step()``: the next step's, as in eager) and the weights."""
    state_mod.reset_for_tests()
    torch.manual_seed(0)
    cbtorch.initialize(cs_ip, settings=settings, model_dir=model_dir)
    model = cbtorch.module(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = make(optimizer) if before_wrap else None
    optimizer = cbtorch.optimizer(optimizer)
    if scheduler is None:
        scheduler = make(optimizer)
    loader = cbtorch.dataloader(DataLoader(data(), batch_size=8, drop_last=True))
    lrs: list[float] = []
    with cbtorch.Session(loader):
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            stepper(scheduler, step, loss)
            cbtorch.add_step_closure(lambda: lrs.append(optimizer.state_dict()["param_groups"][0]["lr"]))
    return lrs, model.weight.detach().clone()


def both(tmp_path: Path, make: Callable[[Any], Any], **kw: Any) -> tuple[list[float], torch.Tensor, list[float], torch.Tensor]:
    """The device's rates and weights, then the CPU path's."""
    return (*run("embedded", str(tmp_path / "dev"), make, **kw), *run(None, str(tmp_path / "cpu"), make, **kw))


@pytest.mark.parametrize("name", sorted(LR_SCHEDULERS) + sorted(HOST_ONLY))
def test_every_torch_scheduler_trains_as_on_the_cpu_bit_for_bit(tmp_path: Path, name: str) -> None:
    make = {**LR_SCHEDULERS, **HOST_ONLY}[name]
    lrs, weight, cpu_lrs, cpu_weight = both(tmp_path, make)
    assert len(set(lrs)) > 1, lrs  # the rate moves
    assert lrs == cpu_lrs
    assert torch.equal(weight, cpu_weight)


def test_a_scheduler_built_before_wrapping_counts_too(tmp_path: Path) -> None:
    lrs, weight, cpu_lrs, cpu_weight = both(tmp_path, LR_SCHEDULERS["StepLR"], before_wrap=True)
    assert lrs == cpu_lrs and torch.equal(weight, cpu_weight)


def on_plateau(scheduler: Any, step: int, loss: Any) -> None:
    """ReduceLROnPlateau on the loss, stepped where the loss is readable: a step closure."""
    cbtorch.add_step_closure(lambda value: scheduler.step(float(value)), (loss,))


def per_epoch(scheduler: Any, step: int, loss: Any) -> None:
    """A schedule stepped every 10 steps (an 'epoch'), as scripts step per-epoch schedulers."""
    if step % 10 == 9:
        scheduler.step()


@pytest.mark.parametrize("make, stepper", [
    (lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=1, threshold=0.5), on_plateau),
    (lambda o: S.StepLR(o, step_size=2, gamma=0.5), per_epoch),
], ids=["plateau-in-a-closure", "per-epoch"])
def test_schedulers_stepped_as_scripts_step_them(tmp_path: Path, make: Callable[[Any], Any], stepper: Stepper) -> None:
    lrs, weight, cpu_lrs, cpu_weight = both(tmp_path, make, stepper=stepper)
    assert len(set(lrs)) > 1, lrs
    assert lrs == cpu_lrs and torch.equal(weight, cpu_weight)


def test_a_torch_scheduler_beside_a_compiled_schedule_is_refused(tmp_path: Path) -> None:
    """Two owners of one learning rate: the settings' schedule (computed on the device) and a torch one."""
    settings = CompileSettings(mixed_precision=False, learning_rate={"scheduler": "Exponential",
                                                                     "initial_learning_rate": 0.05,
                                                                     "decay_steps": 1, "decay_rate": 0.9})
    with pytest.raises(LRSchedulerNotSupported, match="both set the learning rate"):
        run("embedded", str(tmp_path), LR_SCHEDULERS["StepLR"], settings=settings)
