"""The block a run ends with, its performance/<mode>/summary.json, and the schedule's end said once (issue 34).

Train then eval into one model_dir, as the README's main job does: each ends with a summary
block (wall time, steps, loss, samples/s, last checkpoint, TensorBoard, the file), and each mode
has its own summary.json, so the eval no longer overwrites the training figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
import yaml

from tests.run.conftest import DEBUG_YAML


def block(out: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("Run summary (train)") or line.endswith("Run summary (eval)"))
    return lines[start:start + 9]


def test_train_then_eval_each_end_with_a_summary_and_keep_their_own_file(
        fc_mnist: Callable[..., int], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "md"
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu", "--max_steps", "30") == 0
    text = "\n".join(block(capsys.readouterr().out))
    for part in ("Run summary (train)", "wall time", "steps            0 -> 30 (30 this run)", "final loss",
                 "samples/s", f"last checkpoint  {md / 'checkpoint_30.mdl'}", f"tensorboard --logdir {md}",
                 str(md / "performance" / "train" / "summary.json")):
        assert part in text, text
    train = json.loads((md / "performance" / "train" / "summary.json").read_text())
    assert train["mode"] == "train" and train["end_step"] == 30 and train["samples"] == 30 * 64
    assert train["final_loss"] is not None and train["samples_per_sec"] > 0 and train["wall_time_s"] > 0
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "eval", "-o", str(md), "--cpu", "--eval_steps", "3") == 0
    text = "\n".join(block(capsys.readouterr().out))
    assert "Run summary (eval)" in text and "weights of global step 30" in text and "eval loss" in text, text
    evaluation = json.loads((md / "performance" / "eval" / "summary.json").read_text())
    assert evaluation["mode"] == "eval" and evaluation["end_step"] == 30
    assert json.loads((md / "performance" / "train" / "summary.json").read_text()) == train  # not overwritten


def test_a_schedule_that_ends_before_the_last_step_is_said_once(fc_mnist: Callable[..., int], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(DEBUG_YAML.read_text())
    doc["optimizer"]["learning_rate"] = [{"scheduler": "Linear", "initial_learning_rate": 0.05,
                                          "end_learning_rate": 0.0, "steps": 10}]
    params = tmp_path / "short_schedule.yaml"
    params.write_text(yaml.safe_dump(doc))
    assert fc_mnist("-p", str(params), "-m", "train", "-o", str(tmp_path / "md"), "--cpu", "--max_steps", "25") == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "learning-rate schedule reaches 0" in line]
    assert len(said) == 1 and "at step 11: steps 11-25 train at lr 0" in said[0], said
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(tmp_path / "md2"), "--cpu", "--max_steps", "5") == 0
    assert "schedule reaches 0" not in capsys.readouterr().out  # a constant rate: nothing to say
