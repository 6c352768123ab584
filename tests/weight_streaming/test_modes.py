"""The mode changes the plan and the estimate, not the math; gradient accumulation per mode as the system did."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
import torch

from csrun.run.checkpoints import checkpoint_path, load_checkpoint
from csrun.run.summaries import read_losses
from tests.weight_streaming.conftest import debug_yaml

FLOAT32 = {"mixed_precision": False}


def plan_of(model_dir: Path) -> dict:
    (folder,) = model_dir.glob("cs_*")
    return json.loads((folder / "plan.json").read_text())


def test_float32_losses_identical_in_both_modes(gpt: Callable[..., int], tmp_path: Path) -> None:
    yaml_path = debug_yaml(tmp_path / "p.yaml", model=FLOAT32, max_steps=12, log_steps=4)
    losses = {}
    for mode in ("pipeline", "weight_streaming"):
        md = tmp_path / mode
        assert gpt("-m", "train", "-p", str(yaml_path), "-o", str(md), "--cs_ip", "embedded",
                   "--execution_strategy", mode) == 0
        assert plan_of(md)["execution_strategy"] == mode
        losses[mode] = read_losses(md)
    assert [s for s, _ in losses["pipeline"]] == list(range(1, 13))
    assert losses["pipeline"] == losses["weight_streaming"]  # bit for bit
    assert losses["pipeline"][-1][1] < losses["pipeline"][0][1]  # and it trains


def test_grad_accumulation_refused_pipelined(gpt: Callable[..., int], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    yaml_path = debug_yaml(tmp_path / "p.yaml", optimizer={"grad_accum_steps": 2}, max_steps=2)
    assert gpt("-m", "train", "-p", str(yaml_path), "-o", str(tmp_path / "md"), "--cs_ip", "embedded") == 2
    err = capsys.readouterr().err
    assert "Gradient Accumulation not supported on CS workflow." in err
    assert "Fix: set optimizer.grad_accum_steps to 1, or train in weight-streaming mode" in err


def test_grad_accumulation_accepted_in_weight_streaming_as_on_the_cpu(gpt: Callable[..., int], tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Two batches of 4 a step: the device runs them as one batch of 8 (the plan splits it) and lands on the
    weights the CPU's two backward passes give (a loss that is a mean over samples; float rounding apart)."""
    steps = 5  # 40 of the 47 debug windows: no epoch boundary in either grouping
    yaml_path = debug_yaml(tmp_path / "p.yaml", model={**FLOAT32, "loss_scaling": "batch_size"},
                           optimizer={"grad_accum_steps": 2}, max_steps=steps, log_steps=1,
                           save_initial_checkpoint=True)
    data = yaml_path.read_text().replace("shuffle: true", "shuffle: false")
    yaml_path.write_text(data)
    assert gpt("-m", "train", "-p", str(yaml_path), "-o", str(tmp_path / "cpu"), "--cpu") == 0
    assert gpt("-m", "train", "-p", str(yaml_path), "-o", str(tmp_path / "ws"), "--cs_ip", "embedded",
               "--execution_strategy", "weight_streaming") == 0
    assert "grad_accum_steps 2 x batch_size 4 runs as one batch of 8" in capsys.readouterr().out
    plan = plan_of(tmp_path / "ws")
    assert plan["batch_size"] == 8 and plan["micro_batch_size"] == 8  # the debug model fits all 8 at once
    cpu = load_checkpoint(checkpoint_path(tmp_path / "cpu", steps))["model"]
    ws = load_checkpoint(checkpoint_path(tmp_path / "ws", steps))["model"]
    start = load_checkpoint(checkpoint_path(tmp_path / "cpu", 0))["model"]
    assert cpu.keys() == ws.keys()
    moved = 0.0
    for name in cpu:
        torch.testing.assert_close(ws[name], cpu[name], rtol=1e-4, atol=1e-5, msg=name)
        moved = max(moved, float((cpu[name] - start[name]).abs().max()))
    assert moved > 1e-3  # the weights moved far more than the tolerance
