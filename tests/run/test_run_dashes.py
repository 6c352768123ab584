"""run.py takes every option with dashes or underscores, as the README says (issue 34, item 7.6)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import yaml

from tests.conftest import REPO, base_env
from tests.run.conftest import DEBUG_YAML, FC_MNIST

Run = Callable[..., int]


def test_dashed_spellings_run_as_the_underscored_ones(fc_mnist: Run, tmp_path: Path) -> None:
    md = tmp_path / "md"
    assert fc_mnist("--params", str(DEBUG_YAML), "--mode", "train", "--model-dir", str(md), "--cpu",
                    "--max-steps", "3", "--checkpoint-steps=0", "--verify-steps", "0") == 0
    rc = yaml.safe_load((md / "train" / "params_train.yaml").read_text())["runconfig"]
    assert (rc["max_steps"], rc["checkpoint_steps"], rc["verify_steps"], rc["model_dir"]) == (3, 0, 0, str(md))
    assert sorted(p.name for p in md.glob("checkpoint_*.mdl")) == ["checkpoint_3.mdl"]
    # the legacy underscores still work, mixed with dashes
    assert fc_mnist("--params", str(DEBUG_YAML), "--mode", "train", "--model_dir", str(md), "--cpu", "--resume",
                    "--max_steps", "5", "--eval-steps", "1") == 0
    assert sorted(p.name for p in md.glob("checkpoint_*.mdl")) == ["checkpoint_3.mdl", "checkpoint_5.mdl"]


def test_a_bad_value_names_the_flag_whatever_its_spelling(fc_mnist: Run, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(tmp_path / "md"), "--cpu", "--max-steps", "0") == 2
    assert "--max_steps: 0 must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("word", ["--max-step", "--max_stepz", "--model--dir"])
def test_a_misspelt_option_is_still_refused_exit_2(tmp_path: Path, word: str) -> None:
    """The script itself, as a user runs it: one error line naming the word, exit 2, nothing written."""
    md = tmp_path / "md"
    done = subprocess.run([sys.executable, str(FC_MNIST / "run.py"), "--mode", "train", "--params", str(DEBUG_YAML),
                           "--cpu", "-o", str(md), word, "3"], env=base_env(), cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"unrecognized arguments: {word}" in lines[0], done.stderr
    assert not md.exists()
