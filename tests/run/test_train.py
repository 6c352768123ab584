"""fc_mnist through run() in this process: files in model_dir, exact resume, preemption, errors."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Callable

import pytest
import torch

from csrun.run import loops
from csrun.run.summaries import read_losses
from tests.run.conftest import (
    DEBUG_YAML, FULL_YAML, PERFORMANCE_KEYS, assert_same_weights, diverging_yaml, model_tensors, scalars, write_yaml,
)

Run = Callable[..., int]


def test_train_and_eval_leaves_the_legacy_model_dir(fc_mnist: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "md"
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train_and_eval", "-o", str(md)) == 0
    out = capsys.readouterr().out
    assert "Saved checkpoint at global step: 100" in out and "Saved checkpoint at global step: 200" in out
    assert "Training Completed Successfully!" in out and "Avg Eval. Loss = " in out and "Eval. accuracy = " in out
    assert sorted(p.name for p in md.glob("checkpoint_*")) == [
        "checkpoint_100.mdl", "checkpoint_100.mdl.sha256", "checkpoint_200.mdl", "checkpoint_200.mdl.sha256"]
    loss = scalars(md / "train", "loss")
    assert [s for s, _ in loss] == list(range(20, 201, 20))  # log_steps 20
    assert loss[-1][1] < loss[0][1] / 3  # it learns
    assert len(scalars(md / "train", "learning_rate")) == 10
    assert [s for s, _ in scalars(md / "eval", "accuracy")] == [200]
    assert scalars(md / "eval", "accuracy")[0][1] > 0.85
    assert (md / "train" / "params_train.yaml").exists() and (md / "eval" / "params_eval.yaml").exists()
    perf = json.loads((md / "performance" / "performance.json").read_text())
    assert PERFORMANCE_KEYS <= perf.keys()
    assert perf["total_samples"] == 200 * 64 and perf["samples_per_sec"] > 0 and perf["path"] == "cpu"
    assert [s for s, _ in read_losses(md)] == list(range(1, 201))


def test_exact_resume_on_cpu(fc_mnist: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full, part = tmp_path / "full", tmp_path / "part"
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(full)) == 0
    half = write_yaml(tmp_path / "half.yaml", max_steps=100)
    assert fc_mnist("-p", str(half), "-m", "train", "-o", str(part)) == 0
    assert not (part / "checkpoint_200.mdl").exists()
    capsys.readouterr()
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(part), "--resume") == 0
    assert f"Loaded checkpoint {part / 'checkpoint_100.mdl'} at global step 100" in capsys.readouterr().out
    assert_same_weights(full / "checkpoint_200.mdl", part / "checkpoint_200.mdl")
    assert read_losses(part) == read_losses(full)


def test_sigterm_checkpoints_then_resume_matches(fc_mnist: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(full)) == 0
    wants = loops._StepBook.wants

    def signal_at_37(self: loops._StepBook, step: int, unread: int) -> bool:  # the loop asks this after every step
        if step == 37:
            os.kill(os.getpid(), signal.SIGTERM)  # a real signal, caught by the runner's handler
        return wants(self, step, unread)

    monkeypatch.setattr(loops._StepBook, "wants", signal_at_37)
    capsys.readouterr()
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(cut)) == 143
    out = capsys.readouterr().out
    assert "Saved checkpoint at global step: 37" in out and "stopped by SIGTERM at global step 37" in out
    assert [p.name for p in cut.glob("*.mdl")] == ["checkpoint_37.mdl"]
    monkeypatch.setattr(loops._StepBook, "wants", wants)
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(cut), "--resume") == 0
    assert_same_weights(full / "checkpoint_200.mdl", cut / "checkpoint_200.mdl")


def test_resume_falls_back_past_a_corrupt_checkpoint(fc_mnist: Run, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "md"
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md)) == 0
    newest = md / "checkpoint_200.mdl"
    newest.write_bytes(newest.read_bytes()[:1000])
    capsys.readouterr()
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--resume") == 0
    out = capsys.readouterr().out
    assert f"checkpoint {newest} is corrupt or truncated" in out and "falling back to an older checkpoint" in out
    assert "Loaded checkpoint" in out and "at global step 100" in out
    assert model_tensors(newest)  # step 200 was trained again and saved whole


def test_checkpoint_path_and_pretrained(fc_mnist: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "md"
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md)) == 0
    ck = str(md / "checkpoint_200.mdl")
    capsys.readouterr()
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "eval", "-o", str(md), "--checkpoint_path", ck) == 0
    assert float(capsys.readouterr().out.split("Eval. accuracy = ")[1].split()[0]) > 0.85
    pre = write_yaml(tmp_path / "pre.yaml", max_steps=20, checkpoint_steps=0)
    assert fc_mnist("-p", str(pre), "-m", "train", "-o", str(tmp_path / "ft"), "--checkpoint_path", ck,
                    "--is_pretrained_checkpoint") == 0
    assert "Loaded pretrained weights" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "ft").glob("*.mdl")) == ["checkpoint_20.mdl"]  # step restarted at 0
    (md / "checkpoint_100.mdl.sha256").write_text("0" * 64 + "  checkpoint_100.mdl\n")
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "eval", "-o", str(md),
                    "--checkpoint_path", str(md / "checkpoint_100.mdl")) == 1
    assert f"checkpoint {md / 'checkpoint_100.mdl'} is corrupt" in capsys.readouterr().err


def test_nan_loss_stops_with_the_legacy_message(fc_mnist: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = diverging_yaml(tmp_path / "nan.yaml", checkpoint_steps=1)
    assert fc_mnist("-p", str(p), "-m", "train", "-o", str(tmp_path / "md")) == 1
    err = capsys.readouterr().err
    assert "error: NaN loss detected.\n" in err or "error: inf loss detected.\n" in err
    assert "Traceback" not in err
    for ckpt in (tmp_path / "md").glob("*.mdl"):  # every checkpoint written holds finite weights
        assert all(torch.isfinite(t).all() for t in model_tensors(ckpt).values())


def test_config_error_is_one_line_exit_2(fc_mnist: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = write_yaml(tmp_path / "p.yaml", num_epochs=2, num_steps=3)
    assert fc_mnist("-p", str(p), "-m", "train", "-o", str(tmp_path / "md")) == 2
    assert capsys.readouterr().err.endswith(": error: runconfig: give one of num_steps and num_epochs, not both\n")
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train_and_eval", "--cs_ip", "h:1") == 2
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "fly") == 2  # argparse's usage error
    assert "Training with Eval on CS is not currently supported." in capsys.readouterr().err


def test_fc_mnist_full_config_reaches_90_percent(fc_mnist: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fc_mnist("-p", str(FULL_YAML), "-m", "train_and_eval", "-o", str(tmp_path / "md")) == 0
    accuracy = float(capsys.readouterr().out.split("Eval. accuracy = ")[1].split()[0])
    assert accuracy >= 0.90


def test_the_preemption_signal_is_configurable_and_asks_the_batch_script_to_requeue(
        fc_mnist: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """CSRUN_PREEMPT_SIGNAL=USR2: USR2 checkpoints and stops with 140 and writes CSRUN_REQUEUE_FILE."""
    ask = tmp_path / "requeue"
    monkeypatch.setenv("CSRUN_PREEMPT_SIGNAL", "USR2")
    monkeypatch.setenv("CSRUN_REQUEUE_FILE", str(ask))
    wants = loops._StepBook.wants

    def signal_at_21(self: loops._StepBook, step: int, unread: int) -> bool:
        if step == 21:
            os.kill(os.getpid(), signal.SIGUSR2)
        return wants(self, step, unread)

    monkeypatch.setattr(loops._StepBook, "wants", signal_at_21)
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(tmp_path / "md")) == 140
    assert "stopped by SIGUSR2 at global step 21" in capsys.readouterr().out
    assert ask.read_text() == "21\n" and (tmp_path / "md" / "checkpoint_21.mdl").exists()


def test_preemptions_that_gain_no_step_stop_asking_for_a_requeue(
        fc_mnist: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A signal before the first step stops the run without a step; at CSRUN_MAX_IDLE_REQUEUES in a
    row the run exits 1 and does not ask to be requeued; a run that gains a step clears the count."""
    from csrun.run import runner
    from csrun.run.preemption import IDLE_FILE

    md, ask = tmp_path / "md", tmp_path / "requeue"
    monkeypatch.setenv("CSRUN_MAX_IDLE_REQUEUES", "2")
    monkeypatch.setenv("CSRUN_REQUEUE_FILE", str(ask))
    real_progress = runner.Progress

    def signalled_during_setup(**kw: object) -> object:
        os.kill(os.getpid(), signal.SIGUSR1)  # arrives before the first step
        return real_progress(**kw)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "Progress", signalled_during_setup)
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md)) == 138
    assert "before its first step" in capsys.readouterr().out
    assert ask.read_text() == "0\n" and (md / IDLE_FILE).read_text() == "1\n"
    ask.unlink()
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md)) == 1
    err = capsys.readouterr().err
    assert "preempted 2 times in a row without gaining a step" in err and "CSRUN_MAX_IDLE_REQUEUES" in err
    assert len(err.strip().splitlines()) == 1 and not ask.exists()
    monkeypatch.setattr(runner, "Progress", real_progress)
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md)) == 0
    assert not (md / IDLE_FILE).exists()
