"""The whole training step compiled as one graph (csrun.emulator.engine.compiled_step).

Each run trains the same script three ways: eagerly on the CPU path, on the embedded device op by
op (today's path), and on the device with ``CSRUN_COMPILED_STEP`` set: ``graph`` (the captured
whole step, run without inductor's code generation: seconds) for every optimizer and option,
``on`` (inductor) once. The compiled run must take the compiled step (its build is logged), and
its losses and weights must equal eager's within float32 rounding over 100 steps; what it cannot
hold is said once and runs op by op, bit for bit.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

from csrun.compiler import CompileSettings
from csrun.program.spec import LossScalingSpec

from .same_as_eager import Run, assert_bitwise, keep, plain_step, run

STEPS = 100
TOLERANCE = 1e-4
"""Largest relative difference of a loss or a weight from eager's after 100 steps: what float32
rounding of a reordered reduction reaches here is ~1e-6; a wrong formula (a missed bias
correction, weight decay or clipping) is off by far more at the first step it differs."""


def sgd(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)


def adam(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(m.parameters(), lr=1e-2, weight_decay=1e-3)


def adamw(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(m.parameters(), lr=1e-2, betas=(0.8, 0.99), weight_decay=0.05)


def adamw_groups(m: nn.Module) -> torch.optim.Optimizer:
    first, *rest = list(m.parameters())
    return torch.optim.AdamW([{"params": [first], "lr": 3e-2, "weight_decay": 0.0}, {"params": rest}], lr=1e-2)


def adam_first_frozen(m: nn.Module) -> torch.optim.Optimizer:
    next(iter(m.parameters())).requires_grad_(False)  # a frozen weight is an argument of the graph, as a buffer is
    return torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=1e-2)


def clipped(clip: Callable[[Any], Any]) -> Callable[..., None]:
    """A plain step that clips the gradients with ``clip(parameters)`` before the update."""
    def body(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        clip(model.parameters())
        opt.step()
        keep(out.losses, loss)
    return body


clipped_by_norm = clipped(lambda ps: torch.nn.utils.clip_grad_norm_(ps, 0.5))
clipped_by_value = clipped(lambda ps: torch.nn.utils.clip_grad_value_(ps, 0.05))


def compiled_builds(caplog: pytest.LogCaptureFixture) -> int:
    return sum("compiling the whole training step" in r.getMessage() for r in caplog.records)


def eager_and_compiled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                       mode: str, body: Callable[..., None],
                       optimizer: Callable[[nn.Module], torch.optim.Optimizer]) -> tuple[Run, Run, int]:
    """The CPU path's run, the device's with ``CSRUN_COMPILED_STEP=mode``, and how many graphs it built."""
    eager = run(None, tmp_path / "cpu", body, optimizer=optimizer, steps=STEPS)
    monkeypatch.setenv("CSRUN_COMPILED_STEP", mode)
    with caplog.at_level(logging.INFO, logger="csrun.emulator"):
        compiled = run("embedded", tmp_path / mode, body, optimizer=optimizer, steps=STEPS)
    return eager, compiled, compiled_builds(caplog)


def assert_close(got: Run, want: Run) -> None:
    assert len(got.losses) == len(want.losses) == STEPS
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got.losses, want.losses))
    assert worst <= TOLERANCE, worst
    for name, w in want.state.items():
        rel = float((got.state[name] - w).abs().max() / w.abs().max().clamp_min(1e-12))
        assert rel <= TOLERANCE, (name, rel)
    assert got.lrs == want.lrs and got.global_step == want.global_step


@pytest.mark.parametrize("optimizer, body", [
    (sgd, plain_step), (adam, plain_step), (adamw, clipped_by_norm), (adamw_groups, clipped_by_value),
    (adam_first_frozen, plain_step),
], ids=["sgd-nesterov", "adam", "adamw-clip-norm", "adamw-groups-clip-value", "adam-a-frozen-weight"])
def test_the_compiled_step_trains_as_eager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture,
                                           optimizer: Callable[[nn.Module], torch.optim.Optimizer],
                                           body: Callable[..., None]) -> None:
    eager, compiled, builds = eager_and_compiled(tmp_path, monkeypatch, caplog, "graph", body, optimizer)
    assert builds == 1
    assert_close(compiled, eager)


def overflowing(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    """A loss that overflows float32 once scaled at step 37 (gradients of inf), else the plain loss."""
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y) * torch.tensor(1e38 if step == 37 else 1.0)
    loss.backward()
    opt.step()
    keep(out.losses, loss)


def test_dynamic_loss_scaling_skips_the_overflowing_step_as_today(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The overflow is checked in the graph: the step is skipped, the scale halves, as on today's path."""
    settings = CompileSettings(mixed_precision=False, loss_scaling=LossScalingSpec(
        factor="dynamic", initial_loss_scale=2.0 ** 10, steps_per_increase=20))
    today = run("embedded", tmp_path / "today", overflowing, optimizer=adam, settings=settings, steps=STEPS)
    monkeypatch.setenv("CSRUN_COMPILED_STEP", "graph")
    with caplog.at_level(logging.INFO, logger="csrun.emulator"):
        compiled = run("embedded", tmp_path / "graph", overflowing, optimizer=adam, settings=settings, steps=STEPS)
    assert compiled_builds(caplog) == 1
    assert compiled.losses[37] == today.losses[37] > 1e37  # the overflowing step ran compiled: skipped, not nan
    assert compiled.global_step == today.global_step == STEPS
    for name, w in today.state.items():
        rel = float((compiled.state[name] - w).abs().max() / w.abs().max().clamp_min(1e-12))
        assert rel <= TOLERANCE, (name, rel)


def test_an_optimizer_it_cannot_hold_is_said_once_and_runs_op_by_op(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def rmsprop(m: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.RMSprop(m.parameters(), lr=1e-3)

    eager = run(None, tmp_path / "cpu", plain_step, optimizer=rmsprop, steps=10)
    monkeypatch.setenv("CSRUN_COMPILED_STEP", "on")
    with caplog.at_level(logging.INFO):
        device = run("embedded", tmp_path / "dev", plain_step, optimizer=rmsprop, steps=10)
    said = [r.getMessage() for r in caplog.records if "CSRUN_COMPILED_STEP=on" in r.getMessage()]
    assert said == ["CSRUN_COMPILED_STEP=on: the step is not compiled whole because its optimizer is RMSprop "
                    "(compiled: SGD, Adam, AdamW); it runs op by op"]
    assert compiled_builds(caplog) == 0
    assert_bitwise(eager, device, steps=10)


def test_inductor_compiles_the_step_and_it_trains_as_eager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """The product's path: inductor's code for the whole step (a compile of tens of seconds on a
    cold cache)."""
    eager, compiled, builds = eager_and_compiled(tmp_path, monkeypatch, caplog, "on", plain_step, adamw)
    assert builds == 1
    assert_close(compiled, eager)


def restart_adam_at_50(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    if step == 50:
        opt.state.clear()  # Adam starts again: its bias corrections from step 1
    plain_step(step, model, opt, x, y, out)


def test_a_cleared_optimizer_state_restarts_the_bias_corrections(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The step count the bias corrections use is the optimizer state's own, read at each step."""
    eager, compiled, builds = eager_and_compiled(tmp_path, monkeypatch, caplog, "graph", restart_adam_at_50, adam)
    assert builds >= 1
    assert_close(compiled, eager)
