"""Scripts shaped like users' on the device: the loss outside the model, keyword calls, dataclass
outputs, two calls per step, state read through the torch objects, a changed step refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import csrun.torch as cbtorch
from csrun.compiler import CompileSettings
from csrun.driver.step_values import StepChanged
from csrun.emulator.errors import DeviceTensorReadError
from csrun.torch import process_state as state_mod
from tests.tiny_models import Classifier, KeywordLM, TwoHeads

pytestmark = pytest.mark.timeout(120)

STEPS = 30


def data(n: int = 8 * STEPS) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


def typical_loop(cs_ip: str | None, model_dir: str, *, steps: int = STEPS,
                 on_step: Callable[..., None] | None = None) -> tuple[list[float], nn.Module, Any]:
    """The seed blog's typical loop (criterion outside the model, closures reading the loss)."""
    state_mod.reset_for_tests()
    torch.manual_seed(1)
    cbtorch.initialize(cs_ip, settings=CompileSettings(mixed_precision=False), model_dir=model_dir)
    model = cbtorch.module(Classifier())
    optimizer = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    dataloader = cbtorch.dataloader(DataLoader(data(), batch_size=8, drop_last=True))
    loss_fn = nn.CrossEntropyLoss()
    losses: list[float] = []

    @cbtorch.step_closure
    def log(step: int, loss: torch.Tensor) -> None:
        losses.append(loss.item())

    with cbtorch.Session(dataloader, mode="train"):
        for step, (inputs, targets) in enumerate(dataloader):
            optimizer.zero_grad()
            outputs = model(inputs)
            loss = loss_fn(outputs, targets)
            loss.backward()
            optimizer.step()
            log(step, loss)
            if on_step is not None:
                on_step(step, model, optimizer, loss, outputs)
            if step + 1 == steps:
                break
    return losses, model, optimizer


def test_the_typical_loop_trains_on_the_device_as_on_the_cpu(tmp_path: Path) -> None:
    cpu, cpu_model, _ = typical_loop(None, str(tmp_path / "cpu"))
    dev, dev_model, _ = typical_loop("embedded", str(tmp_path / "dev"))
    assert len(dev) == STEPS
    assert dev == pytest.approx(cpu, abs=1e-6)
    for (name, a), b in zip(cpu_model.state_dict().items(), dev_model.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_state_read_through_the_torch_objects_is_the_devices(tmp_path: Path) -> None:
    saved: dict[int, dict[str, torch.Tensor]] = {}
    states: dict[int, dict[str, Any]] = {}

    def on_step(step: int, model: nn.Module, optimizer: Any, loss: Any, outputs: Any) -> None:
        def closure() -> None:  # the legacy habit: save the model from a closure
            path = tmp_path / f"model_{step}.pt"
            torch.save(model.state_dict(), path)
            saved[step] = torch.load(path, weights_only=True)
            states[step] = cbtorch.get_state()

        cbtorch.add_step_closure(closure)

    _, model, optimizer = typical_loop("embedded", str(tmp_path / "dev"), steps=6, on_step=on_step)
    for k in (0, 3, 5):
        for name, value in states[k]["model"].items():
            assert torch.equal(saved[k][name], value), (k, name)
    assert not torch.equal(saved[0]["fc1.weight"], saved[5]["fc1.weight"])
    final = cbtorch.get_state()
    assert torch.equal(model.fc1.weight.detach(), final["model"]["fc1.weight"])  # attribute read after the Session
    assert torch.equal(dict(model.named_parameters())["fc2.bias"].detach(), final["model"]["fc2.bias"])
    momentum = optimizer.state_dict()["state"]
    assert torch.equal(momentum[0]["momentum_buffer"], final["optimizer"]["state"][0]["momentum_buffer"])


def test_load_state_dict_between_sessions_reaches_the_device(tmp_path: Path) -> None:
    _, model, _ = typical_loop("embedded", str(tmp_path / "dev"), steps=3)
    zeros = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    model.load_state_dict(zeros)
    assert torch.equal(cbtorch.get_state()["model"]["fc1.weight"], zeros["fc1.weight"])
    loader = cbtorch.dataloader(DataLoader(data(), batch_size=8, drop_last=True))
    seen: list[float] = []
    with cbtorch.Session(loader, mode="eval"):
        for inputs, targets in loader:
            loss = nn.functional.cross_entropy(model(inputs), targets)
            cbtorch.add_step_closure(lambda v: seen.append(float(v)), (loss,))
            break
    assert seen == pytest.approx([float(torch.log(torch.tensor(3.0)))], rel=1e-6)  # zero weights: uniform


class TokenData(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, 11, (5,), generator=g)
        return {"input_ids": ids, "labels": torch.roll(ids, 1)}


def keyword_run(cs_ip: str | None, model_dir: str) -> list[float]:
    state_mod.reset_for_tests()
    torch.manual_seed(2)
    cbtorch.initialize(cs_ip, settings=CompileSettings(mixed_precision=False), model_dir=model_dir)
    model = cbtorch.module(KeywordLM())
    optimizer = cbtorch.optimizer(torch.optim.Adam(model.parameters(), lr=0.01))
    loader = cbtorch.dataloader(DataLoader(TokenData(), batch_size=4, drop_last=True))
    losses: list[float] = []
    with cbtorch.Session(loader):
        for batch in loader:
            out = model(**batch)
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            cbtorch.add_step_closure(lambda o: losses.append(float(o.loss)), (out,))
    return losses


def test_keyword_calls_with_a_dataclass_output(tmp_path: Path) -> None:
    cpu = keyword_run(None, str(tmp_path / "cpu"))
    dev = keyword_run("embedded", str(tmp_path / "dev"))
    assert len(dev) == 16 and dev == pytest.approx(cpu, abs=1e-6)


def two_heads_run(cs_ip: str | None, model_dir: str) -> list[float]:
    state_mod.reset_for_tests()
    torch.manual_seed(3)
    cbtorch.initialize(cs_ip, settings=CompileSettings(mixed_precision=False), model_dir=model_dir)
    model = cbtorch.module(TwoHeads())
    optimizer = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    loader = cbtorch.dataloader(DataLoader(data(80), batch_size=8, drop_last=True))
    losses: list[float] = []
    with cbtorch.Session(loader):
        for x, y in loader:
            logits, score = model(x)               # two outputs combined in the loss
            logits_again, _ = model(x * 0.5)       # the model called twice in one step
            loss = (nn.functional.cross_entropy(logits, y) + 0.1 * score.pow(2).mean()
                    + 0.5 * nn.functional.cross_entropy(logits_again, y))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            cbtorch.add_step_closure(lambda v: losses.append(float(v)), (loss,))
    return losses


def test_two_outputs_and_two_calls_in_one_step(tmp_path: Path) -> None:
    cpu = two_heads_run(None, str(tmp_path / "cpu"))
    dev = two_heads_run("embedded", str(tmp_path / "dev"))
    assert len(dev) == 10 and dev == pytest.approx(cpu, abs=1e-6)


@pytest.mark.parametrize("change", ["branch", "loss"])
def test_a_changed_step_is_refused_naming_the_line(tmp_path: Path, change: str) -> None:
    state_mod.reset_for_tests()
    cbtorch.initialize("embedded", settings=CompileSettings(mixed_precision=False), model_dir=str(tmp_path))
    model = cbtorch.module(Classifier())
    optimizer = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    loader = cbtorch.dataloader(DataLoader(data(), batch_size=8, drop_last=True))
    with pytest.raises(StepChanged) as info:
        with cbtorch.Session(loader):
            for step, (x, y) in enumerate(loader):
                out = model(x)
                if change == "loss" and step == 2:
                    loss = nn.functional.multi_margin_loss(out, y)  # the other loss
                else:
                    loss = nn.functional.cross_entropy(out, y)
                    if change == "branch" and step == 2:
                        loss = loss + 0.01 * out.abs().mean()  # the other branch
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    assert info.value.location is not None and info.value.location.filename == __file__
    assert ("the other loss" if change == "loss" else "the other branch") in str(info.value)


@pytest.mark.parametrize("use", [
    lambda v: v.item(), lambda v: float(v), lambda v: f"{v}", lambda v: v < 1.0, lambda v: v.tolist(),
    lambda v: v.cpu(), lambda v: v.detach(), lambda v: v.numpy(),
])
def test_step_outputs_outside_closures_give_the_hint(tmp_path: Path, use: Callable[[Any], Any]) -> None:
    state_mod.reset_for_tests()
    cbtorch.initialize("embedded", settings=CompileSettings(mixed_precision=False), model_dir=str(tmp_path))
    model = cbtorch.module(Classifier())
    optimizer = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    loader = cbtorch.dataloader(DataLoader(data(), batch_size=8, drop_last=True))
    kept: list[Any] = []
    inside: list[Any] = []
    with cbtorch.Session(loader):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            kept.append(loss)
            cbtorch.add_step_closure(lambda: inside.append(use(loss)))
            break
    assert inside, "inside a closure the value behaves as a tensor"
    with pytest.raises(DeviceTensorReadError, match="step closure"):
        use(kept[0])
