"""run.py's --max_steps / --eval_steps / --checkpoint_steps flags and runconfig.keep_checkpoint_max."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import pytest
import yaml

from tests.run.conftest import DEBUG_YAML, write_yaml

Run = Callable[..., int]


def checkpoints(md: Path) -> list[str]:
    return sorted(p.name for p in md.iterdir() if p.name.startswith("checkpoint_"))


def test_flags_override_the_yaml_and_are_recorded(fc_mnist: Run, tmp_path: Path) -> None:
    md = tmp_path / "md"
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu",
                    "--max_steps", "40", "--checkpoint_steps", "20", "--eval_steps", "2") == 0
    rc = yaml.safe_load((md / "train" / "params_train.yaml").read_text())["runconfig"]
    assert (rc["max_steps"], rc["checkpoint_steps"], rc["eval_steps"]) == (40, 20, 2)
    assert checkpoints(md) == ["checkpoint_20.mdl", "checkpoint_20.mdl.sha256", "checkpoint_40.mdl",
                               "checkpoint_40.mdl.sha256"]


@pytest.mark.parametrize("flag, value, says", [("--max_steps", "0", "--max_steps: 0 must be at least 1"),
                                               ("--eval_steps", "0", "--eval_steps: 0 must be at least 1"),
                                               ("--checkpoint_steps", "-1", "--checkpoint_steps: -1 must be at least 0"),
                                               ("--max_steps", "ten", "invalid int value: 'ten'")])
def test_a_bad_flag_value_is_one_line(fc_mnist: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str,
                                      value: str, says: str) -> None:
    md = tmp_path / "md"
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu", flag, value) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error" in line]) == 1
    assert not md.exists() or not list(md.glob("checkpoint_*"))


def test_retention_keeps_the_newest_and_the_one_resumed_from(fc_mnist: Run, tmp_path: Path) -> None:
    md = tmp_path / "md"
    params = write_yaml(tmp_path / "p.yaml", max_steps=100, checkpoint_steps=20, keep_checkpoint_max=2)
    assert fc_mnist("-p", str(params), "-m", "train", "-o", str(md), "--cpu", "--max_steps", "60") == 0
    assert checkpoints(md) == ["checkpoint_40.mdl", "checkpoint_40.mdl.sha256", "checkpoint_60.mdl",
                               "checkpoint_60.mdl.sha256"]
    resumed = write_yaml(tmp_path / "r.yaml", max_steps=140, checkpoint_steps=20, keep_checkpoint_max=1)
    assert fc_mnist("-p", str(resumed), "-m", "train", "-o", str(md), "--cpu", "--resume") == 0
    assert checkpoints(md) == ["checkpoint_140.mdl", "checkpoint_140.mdl.sha256", "checkpoint_60.mdl",
                               "checkpoint_60.mdl.sha256"]  # 60: the resume's start, kept


def test_a_models_own_flags_reach_model_fn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """run(..., extra_args_parser_fn=...): the model's flags parse with run.py's and reach params.extra_args."""
    import argparse
    import sys

    from tests.run.conftest import FC_MNIST

    monkeypatch.delenv("CS_IP", raising=False)
    monkeypatch.delenv("CSRUN_LAUNCHER", raising=False)
    monkeypatch.syspath_prepend(str(FC_MNIST))
    for name in ("model", "data"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import data  # noqa: F401
    import model

    from csrun.run import run
    from csrun.torch import process_state as torch_state

    seen: dict = {}

    def extra() -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(add_help=False)
        p.add_argument("--dropout_override", type=float, default=0.0)
        return p

    def model_fn(params):  # type: ignore[no-untyped-def]
        seen.update(params.extra_args)
        return model.FcMnist(params.model)

    in_input: dict = {}

    def train_input_fn(params):  # type: ignore[no-untyped-def]
        in_input.update(params.extra_args)
        return data.train_input_fn(params)

    def call(*argv: str, parser_fn=extra) -> int:  # type: ignore[no-untyped-def]
        torch_state.reset_for_tests()
        try:
            return run(model_fn=model_fn, train_input_fn=train_input_fn, eval_input_fn=data.eval_input_fn,
                       model_config=model.FcMnistConfig, input_config=model.FcMnistInputConfig, argv=list(argv),
                       extra_args_parser_fn=parser_fn)
        finally:
            torch_state.reset_for_tests()

    md = tmp_path / "md"
    assert call("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu", "--max_steps", "5",
                "--dropout_override", "0.25") == 0
    assert seen == {"dropout_override": 0.25} and in_input == seen
    assert "extra_args" not in yaml.safe_load((md / "train" / "params_train.yaml").read_text())
    assert call("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu", "--no_such_flag", "1") == 2
    assert "unrecognized arguments: --no_such_flag" in capsys.readouterr().err

    def clashing() -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(add_help=False)
        p.add_argument("--max_steps", type=int)
        return p

    assert call("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu", parser_fn=clashing) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "extra_args_parser_fn: argument --max_steps: conflicting option string" in err
    assert call("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu",
                parser_fn=lambda: argparse.ArgumentParser()) == 2  # add_help=True: -h clashes
    assert "add_help=False" in capsys.readouterr().err
    for name in ("model", "data"):
        sys.modules.pop(name, None)


def test_log_lines_name_the_task(fc_mnist: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(tmp_path / "md"), "--cpu", "--max_steps", "20") == 0
    out = capsys.readouterr().out.splitlines()
    lines = [line for line in out if " INFO " in f" {line}"]
    assert lines and all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO \[chief 0 @ ", line) for line in lines), lines
    steps = [line for line in out if "| Train: step" in line]  # off a terminal: the time, elapsed and ETA
    assert steps and all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| Train: step \d+/20, .*, \d:\d\d:\d\d elapsed"
                                  r"(, ETA \d:\d\d:\d\d)?$", line) for line in steps), steps
    assert all(", ETA " in line for line in steps[1:]), steps  # from the second: the first starts the clock


def test_a_fresh_run_into_a_used_model_dir_is_refused(fc_mnist: Run, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Starting at step 0 beside an earlier run's checkpoints would mix the two runs: refused, naming --resume."""
    md = tmp_path / "md"
    params = write_yaml(tmp_path / "p.yaml", max_steps=60, checkpoint_steps=20, keep_checkpoint_max=1)
    assert fc_mnist("-p", str(params), "-m", "train", "-o", str(md), "--cpu") == 0
    before = {p.name: p.read_bytes() for p in md.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert fc_mnist("-p", str(params), "-m", "train", "-o", str(md), "--cpu", "--max_steps", "40") == 2
    err = capsys.readouterr().err
    assert "holds an earlier run's checkpoints (up to checkpoint_60.mdl)" in err and "--resume" in err
    assert "start over with --start_over" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in md.rglob("*") if p.is_file()} == before
    assert fc_mnist("-p", str(params), "-m", "train", "-o", str(md), "--cpu", "--resume", "--max_steps", "80") == 0
    assert checkpoints(md) == ["checkpoint_60.mdl", "checkpoint_60.mdl.sha256", "checkpoint_80.mdl",
                               "checkpoint_80.mdl.sha256"]  # 60: the resume's start, kept


def test_start_over_sets_the_earlier_run_aside_and_trains_from_0(fc_mnist: Run, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "md"
    params = write_yaml(tmp_path / "p.yaml", max_steps=40, checkpoint_steps=20)
    assert fc_mnist("-p", str(params), "-m", "train", "-o", str(md), "--cpu") == 0
    earlier = {p.relative_to(md).as_posix(): p.read_bytes() for p in md.rglob("*") if p.is_file()
               and not p.relative_to(md).as_posix().startswith("cs_")}
    capsys.readouterr()
    assert fc_mnist("-p", str(params), "-m", "train", "-o", str(md), "--cpu", "--resume", "--start_over") == 2
    assert "give one of them" in capsys.readouterr().err
    assert fc_mnist("-p", str(params), "-m", "train", "-o", str(md), "--cpu", "--start-over", "--max_steps", "20") == 0
    [aside] = list(md.glob("previous_run_*"))
    assert "--start_over: the earlier run's checkpoints, losses and summaries moved into" in capsys.readouterr().out
    assert {p.relative_to(aside).as_posix(): p.read_bytes() for p in aside.rglob("*") if p.is_file()} == earlier
    assert checkpoints(md) == ["checkpoint_20.mdl", "checkpoint_20.mdl.sha256"]  # the new run's only


@pytest.mark.parametrize("mode, extra, says", [
    ("eval", (), "--mode eval: no valid checkpoint in"),
    ("train", ("--resume",), "--resume: no valid checkpoint in"),
])
def test_nothing_to_load_is_refused_not_scored_or_restarted(fc_mnist: Run, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str], mode: str,
                                                            extra: tuple[str, ...], says: str) -> None:
    """Eval without a checkpoint never scores random weights; --resume without one never starts over."""
    md = tmp_path / "md"
    md.mkdir()
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", mode, "-o", str(md), "--cpu", *extra) == 2
    err = capsys.readouterr().err
    assert says in err and "--checkpoint_path" in err and "Traceback" not in err
    assert not list(md.iterdir())  # nothing written
    (md / "checkpoint_40.mdl").write_bytes(b"not a checkpoint")  # present but unusable: still nothing to load
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", mode, "-o", str(md), "--cpu", *extra) != 0
    err = capsys.readouterr().err
    assert "no valid checkpoint in" in err and "checkpoint_40.mdl" in err and "Traceback" not in err
    assert sorted(p.name for p in md.iterdir()) == ["checkpoint_40.mdl"]  # nothing written, nothing removed

