"""A small model, its data and a training loop written against csrun.torch, for both paths."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import csrun.torch as cbtorch
from csrun.compiler import CompileSettings
from csrun.torch import process_state as state_mod
from tests.tiny_models import MLP

class _Calls:
    """A counter the device does not guard (an object, not a plain value): a forward that changed
    a plain global each call would be refused."""

    count = 0


FORWARD_CALLS = _Calls()
"""Times the Python forward of :class:`CountingMLP` ran (a side effect the device must do once)."""

WARMUP = {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 0.2, "steps": 10}


class CountingMLP(MLP):
    """The shared (6, 16, 3) MLP, forward(batch) -> loss as the device wants it, counting its
    Python forward calls in :data:`FORWARD_CALLS`."""

    def __init__(self) -> None:
        super().__init__(6, 16, 3)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        FORWARD_CALLS.count += 1
        return super().forward(batch)


def dataset(n: int = 160) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return TensorDataset(x, y)


def settings(**kw: Any) -> CompileSettings:
    """float32 (so CPU and device agree to rounding), SGD+momentum from the torch optimizer."""
    kw.setdefault("mixed_precision", False)
    kw.setdefault("learning_rate", WARMUP)
    return CompileSettings(**kw)


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


@dataclass
class Run:
    """What one training run left."""

    losses: list[float] = field(default_factory=list)
    state: dict = field(default_factory=dict)
    global_step: int = 0
    model: nn.Module | None = None


def train(cs_ip: str | None, *, steps: int, model_dir: str, make_opt: Callable[[Any], torch.optim.Optimizer] = sgd,
          compile_settings: CompileSettings | None = None, start: dict | None = None, skip: int = 0,
          seed: int = 1, fresh: bool = True, each_step: Callable[..., None] | None = None) -> Run:
    """``steps`` training steps on ``cs_ip`` (None: CPU), in a fresh user-API state.

    ``start``: a state for set_state (resume at batch ``skip``). Losses are read in a step closure.
    """
    if fresh:
        state_mod.reset_for_tests()
    torch.manual_seed(seed)
    cbtorch.initialize(cs_ip, settings=compile_settings or settings(), model_dir=model_dir)
    model = cbtorch.module(CountingMLP())
    opt = cbtorch.optimizer(make_opt(model.parameters()))
    loader = cbtorch.dataloader(DataLoader(dataset(), batch_size=8, drop_last=True))
    if start is not None:
        cbtorch.set_state(start)
        loader.skip(skip)
    run = Run(model=model)

    @cbtorch.step_closure
    def record(loss: torch.Tensor) -> None:
        run.losses.append(loss.detach().item())

    with cbtorch.Session(loader, report=False):
        n = 0
        while n < steps:
            for batch in loader:
                opt.zero_grad()
                loss = model(batch)
                loss.backward()
                opt.step()
                record(loss)
                if each_step is not None:
                    each_step(n, loss)
                n += 1
                if n == steps:
                    break
    run.state = cbtorch.get_state()
    run.global_step = cbtorch.global_step()
    return run


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest relative difference between two tensors (absolute below 1e-6 magnitudes)."""
    return float(((a - b).abs() / b.abs().clamp_min(1e-6)).max())
