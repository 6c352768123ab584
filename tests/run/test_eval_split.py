"""Eval scores the whole eval split (fc_mnist pads it to whole batches; the model's num_samples
weights each batch) unless eval_steps says otherwise, and says how many samples it scored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
import torch
import yaml

from csrun.run import loops
from csrun.run.inputs import pad_to_whole_batches
from tests.run.conftest import DEBUG_YAML, scalars

Run = Callable[..., int]

EVAL_SPLIT = 359  # models/fc_mnist/data.py: the digits' eval split (batch 64: 5 whole batches + 39)


def test_eval_covers_the_whole_split_and_says_how_many_samples(fc_mnist: Run, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "md"
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu", "--max_steps", "60") == 0
    capsys.readouterr()
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "eval", "-o", str(md), "--cpu") == 0
    out = capsys.readouterr().out
    assert f"Scored {EVAL_SPLIT} eval samples (6 batches) at global step 60" in out
    accuracy = scalars(md / "eval", "accuracy")[0][1]
    assert accuracy * EVAL_SPLIT == pytest.approx(round(accuracy * EVAL_SPLIT), abs=1e-3)  # right answers / 359
    assert json.loads((md / "performance" / "performance.json").read_text())["total_samples"] == EVAL_SPLIT
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "eval", "-o", str(md), "--cpu", "--eval_steps", "2") == 0
    assert "Scored 128 eval samples (2 batches) at global step 60" in capsys.readouterr().out
    assert yaml.safe_load((md / "eval" / "params_eval.yaml").read_text())["runconfig"]["eval_steps"] == 2


def test_the_whole_split_on_the_embedded_emulator_matches_the_cpu(fc_mnist: Run, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "md"
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu", "--max_steps", "40") == 0
    cpu, dev = tmp_path / "cpu", tmp_path / "dev"
    ckpt = str(md / "checkpoint_40.mdl")
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "eval", "-o", str(cpu), "--cpu", "--checkpoint_path", ckpt) == 0
    capsys.readouterr()
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "eval", "-o", str(dev), "--cs_ip", "embedded",
                    "--checkpoint_path", ckpt) == 0
    assert f"Scored {EVAL_SPLIT} eval samples (6 batches) at global step 40" in capsys.readouterr().out
    for tag in ("loss", "accuracy"):
        assert scalars(dev / "eval", tag)[0][1] == pytest.approx(scalars(cpu / "eval", tag)[0][1], rel=1e-5)


def test_num_samples_weights_each_batch() -> None:
    sums = loops._Sums(batch_size=4)
    sums.add({"loss": torch.tensor(1.0), "num_samples": torch.tensor(4)})
    sums.add({"loss": torch.tensor(4.0), "num_samples": torch.tensor(2)})
    sums.add({"loss": torch.tensor(float("nan")), "num_samples": torch.tensor(0)})  # padding only
    assert sums.result() == ({"loss": 2.0}, 6)
    plain = loops._Sums(batch_size=4)
    plain.add({"loss": torch.tensor(1.0)})
    plain.add({"loss": torch.tensor(4.0)})
    assert plain.result() == ({"loss": 2.5}, 8)  # without num_samples every batch counts whole


def test_pad_to_whole_batches() -> None:
    padded = pad_to_whole_batches(list(range(10)), batch_size=4, num_streamers=2, pad=-1)
    assert len(padded) == 16 and padded.real == 10
    assert [padded[i] for i in range(16)] == list(range(10)) + [-1] * 6
    with pytest.raises(IndexError):
        padded[16]
