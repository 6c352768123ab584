"""Dynamic loss scaling: an overflow skips exactly that update and halves the scale; good steps double it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from csrun.compiler.spec import LossScalingSpec, OptimizerSpec
from csrun.emulator.engine.executor import Engine
from csrun.program.errors import SpecError

from .helpers import make_program, quiet


class Scaled(nn.Module):
    """A regression whose loss is multiplied by a factor carried in the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        err = self.lin(batch["x"]) - batch["y"]
        return (err * err).mean() * batch["k"]


def _batch(k: float = 1.0, x_inf: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 4, generator=g)
    if x_inf:
        x[0, 0] = float("inf")
    return {"x": x, "y": torch.randn(8, 1, generator=g), "k": torch.tensor(k)}


def _engine(**ls: object) -> Engine:
    torch.manual_seed(0)
    ep, spec = make_program(
        Scaled(), _batch(), optimizer=OptimizerSpec(type="sgd", hyperparameters={"momentum": 0.9}),
        loss_scaling=LossScalingSpec(**ls), learning_rate=0.01, precision="float16")
    return Engine(ep, spec, notice=quiet)


def _weights(e: Engine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in e.state_dict()["params"].items()}


@pytest.mark.parametrize("bad", [dict(x_inf=True), dict(k=1e38)], ids=["inf-in-batch", "huge-loss"])
def test_overflow_skips_that_update_and_halves(bad: dict) -> None:
    e = _engine(factor="dynamic", initial_loss_scale=2.0**10, steps_per_increase=100)
    scales = []
    for _ in range(3):
        scales.append(e.run_step(_batch())["loss_scale"].item())
    before = _weights(e)
    opt_before = e.state_dict()["optimizer"]
    out = e.run_step(_batch(**bad))
    scales.append(out["loss_scale"].item())
    after = _weights(e)
    assert all(torch.equal(before[k], after[k]) for k in before)  # the update was skipped
    mom_after = e.state_dict()["optimizer"]
    for i, st in opt_before["state"].items():
        assert torch.equal(st["momentum_buffer"], mom_after["state"][i]["momentum_buffer"])
    nxt = e.run_step(_batch())
    assert nxt["loss_scale"].item() == 2.0**9  # halved for the next step
    assert not all(torch.equal(after[k], v) for k, v in _weights(e).items())  # training resumes
    assert scales == [2.0**10] * 4
    assert e.step == 5  # the global step counts the skipped step
    assert e.state_dict()["scaler"]["overflows"] == 1


def test_good_steps_double_until_max_and_overflows_stop_at_min() -> None:
    e = _engine(factor="dynamic", initial_loss_scale=4.0, steps_per_increase=2, max_loss_scale=16.0,
                min_loss_scale=2.0)
    seen = [e.run_step(_batch())["loss_scale"].item() for _ in range(7)]
    assert seen == [4.0, 4.0, 8.0, 8.0, 16.0, 16.0, 16.0]
    for _ in range(4):
        e.run_step(_batch(k=1e38))
    assert e.scaler is not None and e.scaler.scale == 2.0


def test_fixed_factor_scales_exactly_and_never_skips() -> None:
    plain = _engine(factor=1.0)
    scaled = _engine(factor=128.0)
    for _ in range(5):
        a = plain.run_step(_batch())
        b = scaled.run_step(_batch())
        assert b["loss_scale"].item() == 128.0
        assert a["loss"].item() == b["loss"].item()  # powers of two scale exactly
    assert all(torch.equal(plain.state_dict()["params"][k], v) for k, v in scaled.state_dict()["params"].items())


def test_clipping_after_unscale() -> None:
    ep, spec = make_program(Scaled(), _batch(), max_gradient_norm=1e-3, learning_rate=1.0,
                            loss_scaling=LossScalingSpec(factor=1024.0))
    e = Engine(ep, spec, notice=quiet)
    before = _weights(e)
    e.run_step(_batch(k=100.0))
    delta = torch.cat([(v - before[k]).reshape(-1) for k, v in _weights(e).items()])
    assert delta.norm().item() == pytest.approx(1e-3, rel=1e-3)  # lr 1 * clipped norm, scale removed first


@pytest.mark.parametrize("kw,needle", [
    (dict(loss_scaling=LossScalingSpec(factor="sometimes")), "dynamic"),
    (dict(loss_scaling=LossScalingSpec(factor=-1.0)), "positive"),
    (dict(max_gradient_norm=1.0, max_gradient_value=1.0), "not both"),
])
def test_bad_scaling_settings(kw: dict, needle: str) -> None:
    ep, spec = make_program(Scaled(), _batch(), **kw)
    with pytest.raises(SpecError, match=needle):
        Engine(ep, spec, notice=quiet)
