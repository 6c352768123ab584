"""float32 on the emulator (embedded and server) matches an eager PyTorch loop over 50 steps."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import pytest
import torch

from csrun.compiler.spec import OptimizerSpec
from csrun.emulator.remote.client import RemoteDevice
from csrun.emulator.device import Device
from csrun.emulator.embedded import EmbeddedDevice
from csrun.emulator.remote.server import EmulatorServer

from tests.tiny_models import MLP, TinyTransformer, lm_batches, mlp_batches
from .helpers import eager_losses, make_program

STEPS = 50
TOKEN = "numerics-token"

WARMUP = [{"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 0.05, "steps": 10},
          {"scheduler": "Linear", "initial_learning_rate": 0.05, "end_learning_rate": 0.0, "steps": 100}]


def warmup_lr(step: int) -> float:
    """The WARMUP list, written out independently."""
    return 0.05 * step / 10 if step < 10 else 0.05 * (1 - (step - 10) / 100)


EXPO = {"scheduler": "Exponential", "initial_learning_rate": 0.01, "decay_steps": 5, "decay_rate": 0.8,
        "staircase": True}


def expo_lr(step: int) -> float:
    return 0.01 * 0.8 ** (step // 5)


RUNS = {
    "sgd-momentum/warmup": (OptimizerSpec(type="SGD", hyperparameters={"momentum": 0.9}), WARMUP, warmup_lr,
                            lambda ps: torch.optim.SGD(ps, lr=0.0, momentum=0.9)),
    "adamw/exponential": (OptimizerSpec(type="adamw", hyperparameters={"weight_decay_rate": 0.01,
                                                                         "beta1": 0.9, "beta2": 0.99}),
                          EXPO, expo_lr, lambda ps: torch.optim.AdamW(ps, lr=0.0, weight_decay=0.01, betas=(0.9, 0.99))),
}
MODELS: dict[str, Callable[[], tuple[torch.nn.Module, list[Any]]]] = {
    "mlp": lambda: (MLP(), mlp_batches(STEPS)),
    "transformer": lambda: (TinyTransformer(), lm_batches(STEPS)),
}


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    srv = EmulatorServer(token=TOKEN, port=0)
    srv.start()
    yield srv
    srv.shutdown()


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


_CACHE: dict[tuple[str, str], Any] = {}


def _case(model_name: str, run: str) -> Any:
    """Program, batches and eager reference, built once for both places."""
    if (model_name, run) not in _CACHE:
        torch.manual_seed(1)
        model, batches = MODELS[model_name]()
        opt_spec, lr_form, lr_at, make_opt = RUNS[run]
        ep, spec = make_program(model, batches[0], optimizer=opt_spec, learning_rate=lr_form)
        ref_losses, ref_model = eager_losses(model, batches, make_opt, lr_at)
        _CACHE[(model_name, run)] = (ep, spec, batches, lr_at, ref_losses, ref_model)
    return _CACHE[(model_name, run)]


@pytest.mark.parametrize("where", ["embedded", "server"])
@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("run", list(RUNS))
def test_float32_matches_eager(where: str, model_name: str, run: str, server: EmulatorServer) -> None:
    ep, spec, batches, lr_at, ref_losses, ref_model = _case(model_name, run)

    dev: Device
    if where == "embedded":
        dev = EmbeddedDevice(notice=lambda m: None)
    else:
        dev = RemoteDevice(f"127.0.0.1:{server.address[1]}", TOKEN, f"numerics-{model_name}-{run}")
    with dev:
        dev.load(ep, spec)
        handles = [dev.submit(b) for b in batches]
        outs = [h.result() for h in handles]
        state = dev.state_dict()
    for step, (out, ref) in enumerate(zip(outs, ref_losses)):
        assert _rel(out["loss"].item(), ref) <= 1e-6, (step, out["loss"].item(), ref)
        assert out["lr"].item() == pytest.approx(lr_at(step), rel=1e-6)
    assert state["global_step"] == STEPS
    for name, p in ref_model.named_parameters():
        got = state["params"][name]
        err = (got - p.detach()).abs().max().item() / max(p.detach().abs().max().item(), 1e-12)
        assert err <= 1e-6, (name, err)
    assert math.isfinite(outs[-1]["loss"].item())
