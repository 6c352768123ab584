"""The check against eager PyTorch is right both ways (issue 44): it passes correct runs that rounding
makes noisy (float16 attention under AdamW, GPT-2 resumed in weight-streaming mode) and stops one
whose update, gradients or hyperparameters were perturbed on the device; it samples later steps
when asked, and its replay changes nothing the script sees."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

from csrun.compiler import CompileSettings
from csrun.driver import verify
from csrun.driver.verify import DeviceDiffers
from csrun.emulator.engine import executor as engine_mod
from csrun.program import optimizer_classes
from tests.weight_streaming.conftest import GPT  # noqa: F401 - the GPT-2 fixture's module
from tests.weight_streaming.conftest import gpt  # noqa: F401 - the fixture

from .same_as_eager import Run, plain_step, run

pytestmark = pytest.mark.timeout(240)

MIXED = CompileSettings()  # float16 compute, float32 weights: the system's default


class Attention(nn.Module):
    """One attention block: its key bias has a gradient that is zero in exact arithmetic (the
    softmax's rows sum to one), so float16 gives it rounding noise that Adam's tiny second moment
    would turn into an lr-sized step of random sign."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 32)
        self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)
        self.out = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x).view(-1, 4, 8).repeat(1, 1, 4)
        weights = torch.softmax(self.q(h) @ self.k(h).transpose(1, 2) / 32 ** 0.5, -1)
        return self.out((weights @ self.v(h)).mean(1))


def adamw(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01)


def checked_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps: int = 8, **kw: Any) -> Run:
    monkeypatch.setenv("CSRUN_VERIFY_STEPS", str(steps))
    return run("embedded", tmp_path, plain_step, model=Attention, optimizer=adamw, **kw)


def test_a_correct_float16_attention_under_adamw_passes_every_checked_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checks: list[int] = []
    real = verify.StepCheck.finish
    monkeypatch.setattr(verify.StepCheck, "finish", lambda self, *a: checks.append(1) or real(self, *a))
    out = checked_run(tmp_path, monkeypatch, settings=MIXED)
    assert len(checks) == 8 and len(out.losses) == 8


def perturb_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device's update runs at 1.001 times the learning rate."""
    real = optimizer_classes.set_learning_rate
    monkeypatch.setattr(engine_mod.optimizers, "set_learning_rate",
                        lambda opt, lr: real(opt, [r * 1.001 for r in lr] if isinstance(lr, list) else lr * 1.001))


def perturb_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device's update applies 1.05 times the gradient of one weight."""
    real = engine_mod.clipping.clip_gradients

    def clip(grads: list[torch.Tensor], **kw: Any) -> Any:
        grads[0].mul_(1.05)
        return real(grads, **kw)

    monkeypatch.setattr(engine_mod.clipping, "clip_gradients", clip)


def perturb_weight_decay(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device's optimizer decays the weights at 0.02 where the script says 0.01."""
    real = optimizer_classes.build_optimizer

    def build(*a: Any, **kw: Any) -> torch.optim.Optimizer:
        opt = real(*a, **kw)
        for group in opt.param_groups:
            group["weight_decay"] = 0.02
        return opt

    monkeypatch.setattr(engine_mod.optimizers, "build_optimizer", build)


@pytest.mark.parametrize("perturb, where", [
    (perturb_update, "its update in the step"),
    (perturb_gradient, "the gradient of"),
    (perturb_weight_decay, "its update in the step"),
], ids=["lr-1.001", "one-gradient-1.05", "weight-decay"])
@pytest.mark.parametrize("settings", [MIXED, CompileSettings(mixed_precision=False)], ids=["float16", "float32"])
def test_a_perturbed_device_is_stopped_at_the_first_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        perturb: Callable[[pytest.MonkeyPatch], None], where: str,
                                                        settings: CompileSettings) -> None:
    perturb(monkeypatch)
    with pytest.raises(DeviceDiffers, match=where) as info:
        checked_run(tmp_path, monkeypatch, steps=1, settings=settings)
    assert "step 1 on the device differs" in str(info.value)


def test_a_sampled_check_runs_every_k_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checks: list[int] = []
    real = verify.StepCheck.finish
    monkeypatch.setattr(verify.StepCheck, "finish",
                        lambda self, *a: checks.append(self.facts.number) or real(self, *a))
    monkeypatch.setenv("CSRUN_VERIFY_STEPS", "1")
    monkeypatch.setenv("CSRUN_VERIFY_EVERY", "3")
    run("embedded", tmp_path, plain_step, model=Attention, optimizer=adamw, settings=MIXED)
    assert checks == [1, 3, 6]


def test_a_sampled_check_catches_a_device_that_goes_wrong_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = engine_mod.Engine._rates

    def wrong_after_four(self: Any, step: int, plan: Any = None) -> Any:
        rates = real(self, step, plan) if plan is not None else real(self, step)
        return [r * 2 for r in rates] if step >= 4 and isinstance(rates, list) else (rates * 2 if step >= 4 else rates)

    monkeypatch.setattr(engine_mod.Engine, "_rates", wrong_after_four)
    monkeypatch.setenv("CSRUN_VERIFY_STEPS", "1")
    monkeypatch.setenv("CSRUN_VERIFY_EVERY", "6")
    with pytest.raises(DeviceDiffers, match="step 6 on the device differs"):
        run("embedded", tmp_path, plain_step, model=Attention, optimizer=adamw, settings=MIXED)


class Talkative(Attention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print("forward ran")
        return super().forward(x)


def test_the_checks_replay_prints_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The forward's Python runs once on the device path (the step's recording), checked or not."""
    for steps in ("0", "4"):
        monkeypatch.setenv("CSRUN_VERIFY_STEPS", steps)
        run("embedded", tmp_path / steps, plain_step, model=Talkative, optimizer=adamw)
        assert capsys.readouterr().out.count("forward ran") == 1, steps


def test_gpt2_resumes_in_weight_streaming_mode_with_the_check_on(
        gpt: Callable[..., int], tmp_path: Path) -> None:  # noqa: F811 - the fixture
    """models/gpt2's debug config (float16, AdamW, clipping, dynamic loss scaling): a run, then a
    resume from its checkpoint, each checking its first steps."""
    params = str(Path(__file__).parents[2] / "configs" / "gpt2_debug.yaml")
    common = ["-p", params, "-o", str(tmp_path / "md"), "--cs_ip", "embedded", "--execution_strategy",
              "weight_streaming", "--verify_steps", "3", "--checkpoint_steps", "6"]
    assert gpt("-m", "train", *common, "--max_steps", "6") == 0
    assert gpt("-m", "train", *common, "--max_steps", "10", "--resume", "--verify_every", "2") == 0
    assert (tmp_path / "md" / "checkpoint_10.mdl").is_file()


def test_the_readme_jobs_float16_config_passes_twelve_checked_steps(tmp_path: Path) -> None:
    """configs/fc_mnist.yaml (ten layers, float16 by rounding): as training goes on the gradients
    shrink and 16-bit rounding becomes a larger part of them (step 4's last bias: 0.00242 apart where
    a fixed tolerance allowed 0.00227); each gradient is held to this step's own rounding, measured by
    the same step replayed under autocast (verify.NOISE_FACTOR)."""
    import subprocess
    import sys

    from tests.conftest import REPO, base_env

    done = subprocess.run([sys.executable, str(REPO / "models" / "fc_mnist" / "run.py"), "--mode", "train",
                           "--params", str(REPO / "configs" / "fc_mnist.yaml"), "--cs_ip", "embedded",
                           "--max_steps", "12", "--verify_steps", "12", "-o", str(tmp_path / "md")],
                          env={**base_env(), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "md" / "checkpoint_12.mdl").is_file()
