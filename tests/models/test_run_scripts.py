"""models/<name>/run.py end to end on CPU: a few training steps of the debug config, then eval."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .helpers import CONFIGS, MODELS, REPO


def _short_config(name: str, tmp_path: Path) -> Path:
    data = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    data["runconfig"].update(max_steps=4, checkpoint_steps=2, log_steps=1, eval_steps=2)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.timeout(120)
@pytest.mark.parametrize("model,config", [("bert", "bert_debug"), ("gpt2", "gpt2_debug")])
def test_run_py_trains_and_evaluates_on_cpu(model: str, config: str, tmp_path: Path) -> None:
    params, out = _short_config(config, tmp_path), tmp_path / "model_dir"
    env = {k: v for k, v in os.environ.items() if k not in ("CS_IP", "CSRUN_LAUNCHER")}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, str(MODELS / model / "run.py"), "--params", str(params), "-o", str(out), "--cpu"]
    done = subprocess.run([*cmd, "--mode", "train_and_eval"], check=False, capture_output=True, text=True,
                          timeout=110,
                          cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for step in (0, 2, 4):
        assert (out / f"checkpoint_{step}.mdl").is_file()
    text = done.stdout + done.stderr
    assert "Training Completed Successfully!" in text and "Avg Eval. Loss" in text
    assert ("Eval. mlm_accuracy" if model == "bert" else "Eval. perplexity") in text


@pytest.mark.timeout(120)
def test_bert_run_py_trains_on_the_embedded_system(tmp_path: Path) -> None:
    """The system path: compile, then the emulator runs the captured step with float16 compute."""
    params, out = _short_config("bert_debug", tmp_path), tmp_path / "model_dir"
    env = {k: v for k, v in os.environ.items() if k != "CS_IP"}
    env.update(PYTHONPATH=str(REPO), CSRUN_LAUNCHER="csrun_wse")  # as launched by csrun_wse: embedded emulator
    cmd = [sys.executable, str(MODELS / "bert" / "run.py"), "--params", str(params), "-o", str(out), "--mode", "train"]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=110, cwd=tmp_path, env=env)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-6000:]
    assert "Compile for training completed successfully!" in text and "Training Completed Successfully!" in text
    assert (out / "checkpoint_4.mdl").is_file() and list(out.glob("cs_*/plan.json"))
