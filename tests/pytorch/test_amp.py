"""cstorch.amp: dynamic loss scaling skips an overflowing step and lowers the scale exactly as
torch's GradScaler does, on the CPU backend and on the device; optimizer_step clips as the device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import csrun.pytorch as cstorch
from tests.pytorch.scripts import tiny

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("fresh")]

OVERFLOW_AT = 3  # 1-based step whose batch holds an inf


def batches() -> torch.utils.data.TensorDataset:
    x, y = tiny.dataset().tensors
    x = x[: 8 * 8].clone()
    x[(OVERFLOW_AT - 1) * 8, 0] = float("inf")
    return torch.utils.data.TensorDataset(x, y[: 8 * 8])


def torch_reference() -> list[tuple[float, dict[str, torch.Tensor]]]:
    """Plain torch: torch.amp.GradScaler on the CPU, the same batches."""
    torch.manual_seed(0)
    model = tiny.Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    seen = []
    for x, y in torch.utils.data.DataLoader(batches(), batch_size=8):
        opt.zero_grad()
        scaler.scale(torch.nn.functional.nll_loss(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        seen.append((scaler.get_scale(), {k: v.clone() for k, v in model.state_dict().items()}))
    return seen


def cstorch_run(backend_type: str, artifacts: Path) -> list[tuple[float, dict[str, torch.Tensor]]]:
    backend = cstorch.backend(backend_type, artifact_dir=str(artifacts))
    torch.manual_seed(0)
    with backend.device:
        model = tiny.Model()
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1)
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic", init_scale=1024.0, steps_per_increase=2)
    seen: list[tuple[float, dict[str, torch.Tensor]]] = []

    @cstorch.trace
    def training_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.nll_loss(compiled(x), y)
        cstorch.amp.optimizer_step(loss, opt, scaler)
        return loss

    @cstorch.step_closure
    def record() -> None:
        seen.append((scaler.get_scale(), {k: v.clone() for k, v in model.state_dict().items()}))

    loader = cstorch.utils.data.DataLoader(torch.utils.data.DataLoader, batches(), batch_size=8, drop_last=True)
    for x, y in cstorch.utils.data.DataExecutor(loader):
        training_step(x, y)
        record()
    return seen


@pytest.mark.parametrize("backend_type", ["CPU", "CSX"])
def test_an_overflow_skips_the_step_and_halves_the_scale_as_torch(backend_type: str, tmp_path: Path) -> None:
    ours, ref = cstorch_run(backend_type, tmp_path), torch_reference()
    assert [s for s, _ in ours] == [s for s, _ in ref] == [1024.0, 2048.0, 1024.0, 1024.0, 2048.0, 2048.0,
                                                           4096.0, 4096.0]
    for step, ((_, w), (_, r)) in enumerate(zip(ours, ref), start=1):
        for key in r:
            assert torch.allclose(w[key], r[key], atol=1e-6, rtol=0), (step, key)
    skipped, before = ours[OVERFLOW_AT - 1][1], ours[OVERFLOW_AT - 2][1]
    assert all(torch.equal(skipped[k], before[k]) for k in before)  # the overflowing step changed nothing


def test_optimizer_step_clips_the_global_norm_like_torch() -> None:
    cstorch.backend("CPU")
    torch.manual_seed(0)
    model, twin = tiny.Model(), tiny.Model()
    twin.load_state_dict(model.state_dict())
    opt = cstorch.optim.SGD(model.parameters(), lr=1.0)
    x, y = tiny.dataset().tensors
    loss = torch.nn.functional.nll_loss(model(x[:8] * 100), y[:8])
    cstorch.amp.optimizer_step(loss, opt, None, max_gradient_norm=0.5)
    torch.nn.functional.nll_loss(twin(x[:8] * 100), y[:8]).backward()
    torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5)
    torch.optim.SGD(twin.parameters(), lr=1.0).step()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=0), name
        assert p.grad is None  # optimizer_step zeroed the gradients, as the device never carries them over
