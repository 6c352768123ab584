"""The CPU run warns, once each, about what the device will refuse (csrun.torch.device_preview)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import csrun.torch as cbtorch
from csrun.compiler import CompileSettings
from csrun.torch import process_state as state_mod

SOURCE = Path(__file__).read_text().splitlines()


def line_of(marker: str) -> int:
    """The line of this file that ends with ``# L:<marker>``."""
    [n] = [i for i, text in enumerate(SOURCE, 1) if text.rstrip().endswith(f"# L:{marker}")]
    return n


class Careless(nn.Module):
    """A forward that counts calls in Python and branches on a tensor's value."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global CALLS
        CALLS += 1  # L:global
        self.calls += 1  # L:count
        if x.abs().max() > 1e6:  # L:branch
            raise ValueError("huge input")
        return self.fc(x)


CALLS = 0


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 6, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8, drop_last=True)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "csrun.torch" and r.levelno == logging.WARNING]


def test_the_cpu_run_warns_once_about_each_thing_the_device_refuses(caplog: pytest.LogCaptureFixture) -> None:
    state_mod.reset_for_tests()
    cbtorch.initialize(None, cpu=True, settings=CompileSettings(mixed_precision=False))
    model = cbtorch.module(Careless())
    optimizer = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9 ** step)  # the device runs it now
    data = cbtorch.dataloader(loader())
    losses = []
    with caplog.at_level(logging.WARNING, logger="csrun.torch"), cbtorch.Session(data):
        for step, (x, y) in enumerate(data):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            if loss.item() > 100:  # L:read
                print("diverged")
            loss.backward()  # L:backward
            if step % 2 == 1:
                optimizer.step()
                schedule.step()
            losses.append(loss.detach())
    said = warnings_of(caplog)
    assert len(losses) == 4  # the CPU run itself ran as PyTorch does
    expected = {
        "global": "the forward changes the Python global tests.torch.test_device_preview.CALLS each call",
        "read": "the loop calls .item() on a value computed from the model's outputs outside a step closure",
        "branch": "the model takes the truth value of a tensor",
        "count": "the forward assigns a Python value each call: model.calls changed (1 -> 2)",
        "backward": "gradient accumulation (loss.backward() without optimizer.step() in the step): refused",
    }
    for marker, text in expected.items():
        line = f"on the device: {__file__}:{line_of(marker)}: {text}"
        assert sum(1 for s in said if s.startswith(line)) == 1, (line, said)
    assert len(said) == len(expected), said


def test_a_script_the_device_runs_as_written_gets_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    state_mod.reset_for_tests()
    cbtorch.initialize(None, cpu=True)
    model = cbtorch.module(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)))
    optimizer = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    data = cbtorch.dataloader(loader())
    seen: list[float] = []
    with caplog.at_level(logging.WARNING, logger="csrun.torch"), cbtorch.Session(data):
        for x, y in data:
            optimizer.zero_grad()
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            loss.backward()
            optimizer.step()
            schedule.step()
            if x.max().item() > -1e9:  # the batch's own values are readable on the device too
                cbtorch.add_step_closure(lambda v: seen.append(v.item()), (loss,))
    assert len(seen) == 4
    assert warnings_of(caplog) == []
