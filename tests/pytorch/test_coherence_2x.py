"""Issue 44 through the 2.x API: a hand-written warm-up, a momentum change and a weight edited between
steps reach the device; CSX (the embedded emulator) trains bit for bit as the CPU backend."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import csrun.pytorch as cstorch
from csrun.pytorch import backends as cstorch_backend
from csrun.torch import process_state as state_mod
from tests.pytorch.scripts import tiny

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("fresh")]


def loader() -> cstorch.utils.data.DataLoader:
    x, y = tiny.dataset().tensors
    return cstorch.utils.data.DataLoader(torch.utils.data.DataLoader, torch.utils.data.TensorDataset(x[:80], y[:80]),
                                         batch_size=8, drop_last=True)


def train(backend_type: str, tmp_path: Path) -> tuple[list[float], dict[str, torch.Tensor]]:
    state_mod.reset_for_tests()
    cstorch_backend.reset_for_tests()
    backend = cstorch.backend(backend_type, artifact_dir=str(tmp_path / backend_type))
    torch.manual_seed(0)
    model = tiny.Model()
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses: list[float] = []

    @cstorch.trace
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.nll_loss(compiled(x), y)
        cstorch.amp.optimizer_step(loss, opt)
        return loss

    @cstorch.step_closure
    def record(loss: torch.Tensor) -> None:
        losses.append(float(loss))

    executor = cstorch.utils.data.DataExecutor(loader())
    for n, (x, y) in enumerate(executor):
        for group in opt.param_groups:
            group["lr"] = 0.1 * min(1.0, (n + 1) / 4)  # a hand-written warm-up
            group["momentum"] = 0.5 if n > 5 else 0.9
        with torch.no_grad():
            for p in model.parameters():
                p.clamp_(-0.3, 0.3)
        record(step(x, y))
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def test_changes_between_steps_reach_the_device_as_on_the_cpu(tmp_path: Path) -> None:
    cpu_losses, cpu_state = train("CPU", tmp_path)
    dev_losses, dev_state = train("CSX", tmp_path)
    assert len(cpu_losses) == 10 and dev_losses == cpu_losses
    for name, want in cpu_state.items():
        assert torch.equal(dev_state[name], want), name
