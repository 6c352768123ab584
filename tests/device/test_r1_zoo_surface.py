"""An R1.6 zoo-shaped runner on the embedded device: ``initialize`` with R1.6's keywords and the
zoo's ``cs_ip`` (``embedded:9000``), ``amp.GradScaler(...)`` called on the loss, int32 labels and
float16 inputs as the zoo's CS input functions make them; the scaler's loss scaling and clipping
are the compile's, and the float32 losses equal eager PyTorch's. ``cbtorch.compile(validate_only=)``
returns instead of exiting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import csrun.torch as cbtorch
import csrun.torch.core.cb_model as cm
from csrun.torch.r1 import amp as r1_amp
from csrun.torch.r1 import framework, modes, settings


@pytest.fixture(autouse=True)
def fresh_r1() -> None:
    settings.reset_for_tests()
    r1_amp.reset_for_tests()
    framework.reset_for_tests()


class Net(nn.Module):
    """fc_mnist's shape in small: log-softmax outputs and ``nll_loss`` on the labels."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(6, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.log_softmax(self.fc2(torch.relu(self.fc1(x))), dim=1)
        return nn.functional.nll_loss(out, y)


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 6, generator=g).to(torch.float16)  # the zoo's CS inputs: float16
    y = torch.randint(0, 3, (64,), generator=g).to(torch.int32)  # and int32 labels
    return TensorDataset(x, y)


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, *, widen: bool = False) -> list[float]:
    """A plain loop over :func:`data` in a Session; each step's loss read in a closure."""
    loader = cbtorch.dataloader(DataLoader(data(), batch_size=8, drop_last=True))
    losses: list[float] = []
    with cbtorch.Session(loader, modes.TRAIN, report=False):
        for x, y in loader:
            opt.zero_grad()
            loss = model(x.float(), y.long()) if widen else model(x, y)
            loss.backward()
            opt.step()
            cm.add_step_closure(lambda v: losses.append(v.item()), args=(loss,))
    return losses


def eager_losses(steps: int, max_norm: float, rate: Callable[[int], float] = lambda step: 0.1) -> list[float]:
    model, losses = Net(), []
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step, (x, y) in enumerate(list(DataLoader(data(), batch_size=8, drop_last=True))[:steps]):
        for group in opt.param_groups:
            group["lr"] = rate(step)
        opt.zero_grad()
        loss = model(x.float(), y.long())
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        losses.append(loss.item())
    return losses


def test_an_r16_runner_trains_on_the_embedded_device_as_eager(tmp_path: Path) -> None:
    framework.initialize(service_workdir=str(tmp_path), compile_dir=str(tmp_path), cs_ip="embedded:9000")
    assert cm.use_cs() and cm.is_wse_device()
    model = cbtorch.module(Net())
    opt = framework.optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    scaler = r1_amp.GradScaler(loss_scale="dynamic", max_gradient_norm=0.5, mixed_precision=False)
    loader = cbtorch.dataloader(DataLoader(data(), batch_size=8, drop_last=True))
    losses: list[float] = []

    @cm.step_closure
    def keep(loss: torch.Tensor) -> None:
        losses.append(cm.to_cpu(loss).item())

    with cbtorch.Session(loader, modes.TRAIN, report=False):
        for x, y in loader:
            opt.zero_grad()
            loss = model(x, y)
            scaler(loss).backward()
            opt.step()
            keep(loss)
    assert cm.get_run_step() == 8
    assert losses == pytest.approx(eager_losses(8, 0.5), abs=1e-5)
    [spec] = tmp_path.glob("cs_*/spec.json")
    recorded = json.loads(spec.read_text())
    assert recorded["loss_scaling"]["factor"] == "dynamic" and recorded["max_gradient_norm"] == 0.5
    assert {t["dtype"] for t in recorded["inputs"]} == {"float32", "int32"}  # float16 widened, int32 as streamed
    assert cm.metrics_counter_value("CerebrasCompileTimeMs") >= 0


@pytest.mark.parametrize("validate", [True, False])
def test_compile_returns_whether_the_step_compiled(tmp_path: Path, validate: bool) -> None:
    framework.initialize(service_workdir=str(tmp_path), compile_only=True)  # the zoo: compile_only for both
    model = cbtorch.module(Net())
    opt = framework.optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    loader = cbtorch.dataloader(DataLoader(data(), batch_size=8, drop_last=True))
    for x, y in loader:  # the zoo's compile runner: one step, then compile()
        model(x, y).backward()
        opt.step()
        break
    assert framework.compile(fabric_config_file=None, validate_only=validate) is True
    assert bool(list(tmp_path.glob("cs_*/spec.json"))) == (not validate)


def test_the_zoos_device_schedule_runs_and_its_lambdalr_beside_it_changes_nothing(tmp_path: Path) -> None:
    """The zoo builds cbtorch's scheduler (the device's schedule) and a torch LambdaLR on
    ``optimizer._optimizer`` whose step() it overrides; the device runs the schedule."""
    framework.initialize(service_workdir=str(tmp_path), compile_dir=str(tmp_path), cs_ip="embedded:9000")
    model = cbtorch.module(Net())
    opt = framework.optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    r1_amp.GradScaler(loss_scale=None, mixed_precision=False)  # the zoo builds one on every CS run: float32 here
    framework.optim.lr_scheduler.Exponential(opt, 0.1, 2, 0.5, False, False)
    torch.optim.lr_scheduler.LambdaLR(opt._optimizer, lambda step: 1.0)
    losses = train_steps(model, opt)
    want = eager_losses(8, 1e9, lambda step: 0.1 * 0.5 ** (step / 2))
    assert losses == pytest.approx(want, abs=1e-5)


class AdamW(torch.optim.Optimizer):
    """Shaped like the R1.x zoo's AdamBase family (user code the device must follow): running beta
    powers for bias correction, an L2 term on the gradient, decoupled decay on the update."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,  # noqa: ANN001
                 l2_regularization_rate=0.0, correct_bias=True, amsgrad=False) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      l2_regularization_rate=l2_regularization_rate, correct_bias=correct_bias,
                                      amsgrad=amsgrad))
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                if amsgrad:
                    state["max_exp_avg_sq"] = torch.zeros_like(p)
                if correct_bias:
                    state["beta1_power"], state["beta2_power"] = torch.tensor(betas[0]), torch.tensor(betas[1])

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state, grad = self.state[p], p.grad
                if group["l2_regularization_rate"] > 0:
                    grad = grad.add(p, alpha=group["l2_regularization_rate"])
                state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                second = state["exp_avg_sq"]
                if group["amsgrad"]:
                    torch.maximum(state["max_exp_avg_sq"], second, out=state["max_exp_avg_sq"])
                    second = state["max_exp_avg_sq"]
                update = state["exp_avg"] / second.sqrt().add_(group["eps"])
                if group["correct_bias"]:
                    one = torch.tensor(1.0)
                    update *= torch.sqrt(one - state["beta2_power"]) / (one - state["beta1_power"])
                    state["beta1_power"] *= beta1
                    state["beta2_power"] *= beta2
                if group["weight_decay"] > 0:
                    update.add_(p, alpha=group["weight_decay"])
                update *= group["lr"]
                p.sub_(update)


@pytest.mark.parametrize("hyper", [dict(weight_decay=0.01), dict(l2_regularization_rate=0.01, amsgrad=True),
                                   dict(correct_bias=False, weight_decay=0.01)])
def test_the_zoos_adam_family_trains_on_the_device_as_its_class_computes(tmp_path: Path, hyper: dict) -> None:
    def run(cs_ip: str | None) -> list[float]:
        settings.reset_for_tests()
        from csrun.torch import process_state as state_mod
        state_mod.reset_for_tests()
        framework.initialize(service_workdir=str(tmp_path / str(cs_ip)), cs_ip=cs_ip)
        model = cbtorch.module(Net())
        opt = framework.optimizer(AdamW(model.parameters(), lr=0.01, **hyper))
        r1_amp.GradScaler(mixed_precision=False)
        return train_steps(model, opt, widen=True)

    assert run("embedded") == run(None)  # float32, bit for bit (the first step is also checked against eager)


class GradientClipper:
    """Shaped like the zoo's: the limit and torch's clipping function, called only on its CPU path."""

    def __init__(self, max_gradient_norm: float = 0.0, max_gradient_value: float = 0.0) -> None:
        self.max_gradient = max_gradient_norm or max_gradient_value
        self.max_gradient_fn = (nn.utils.clip_grad_norm_ if max_gradient_norm else
                                nn.utils.clip_grad_value_ if max_gradient_value else None)

    def __call__(self, params) -> None:  # noqa: ANN001
        if self.max_gradient_fn is not None:
            self.max_gradient_fn(params, self.max_gradient)


def test_the_optimizers_gradient_clipper_is_the_devices_clipping(tmp_path: Path) -> None:
    """The zoo assigns ``optimizer.gradient_clipper`` and never calls it on the CS path; R1.6's
    wrapper clipped in ``step()``: so does the device."""
    framework.initialize(service_workdir=str(tmp_path), compile_dir=str(tmp_path), cs_ip="embedded")
    model = cbtorch.module(Net())
    opt = framework.optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    r1_amp.GradScaler(mixed_precision=False)
    opt.gradient_clipper = GradientClipper(max_gradient_value=0.02)
    assert isinstance(opt.gradient_clipper, GradientClipper) and type(opt).__name__ == "SGD"
    losses = train_steps(model, opt)
    eager, want = Net(), []
    ref = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    for x, y in DataLoader(data(), batch_size=8, drop_last=True):
        ref.zero_grad()
        loss = eager(x.float(), y.long())
        loss.backward()
        nn.utils.clip_grad_value_(eager.parameters(), 0.02)
        ref.step()
        want.append(loss.item())
    assert losses == pytest.approx(want, abs=1e-5)
    [spec] = tmp_path.glob("cs_*/spec.json")
    assert json.loads(spec.read_text())["max_gradient_value"] == 0.02


def test_a_model_called_outside_a_session_takes_int32_and_float16_as_the_session_does(tmp_path: Path) -> None:
    framework.initialize(service_workdir=str(tmp_path), cs_ip="embedded")
    r1_amp.GradScaler(mixed_precision=False)
    model = cbtorch.module(Net())
    opt = framework.optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    x, y = data().tensors
    losses: list[float] = []
    for i in range(2):  # each call on new CPU tensors is a step of its own
        opt.zero_grad()
        loss = model(x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8])
        loss.backward()
        opt.step()
        cm.add_step_closure(lambda v: losses.append(v.item()), args=(loss,))
    cm.mark_step()
    assert losses == pytest.approx(eager_losses(2, 1e9), abs=1e-5)
