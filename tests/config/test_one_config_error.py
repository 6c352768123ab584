"""One ConfigError: a single class, exit code 2, from every command that reads configuration."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import csrun.compiler.errors
import csrun.errors
import csrun.typed_config
from csrun.cli import csrun_cpu, csrun_wse, python_pt
from csrun.run import run
from csrun.run.params import InputConfig, ModelConfig
from csrun.torch import process_state as torch_state

PACKAGE = Path(__file__).resolve().parents[2] / "csrun"


def test_a_single_class() -> None:
    assert csrun.errors.ConfigError is csrun.typed_config.ConfigError is csrun.compiler.errors.ConfigError
    defined = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
               for node in ast.walk(ast.parse(p.read_text()))
               if isinstance(node, ast.ClassDef) and node.name.endswith("ConfigError")]
    assert defined == ["errors.py"]
    assert csrun.errors.ConfigError.exit_code == 2


def test_a_compile_config_problem_is_the_same_error() -> None:
    exc = csrun.compiler.errors.ConfigError("optimizer.momentum must be a number, got 'x'", fix="set momentum to a number")
    assert isinstance(exc, csrun.errors.UserError) and exc.exit_code == 2
    assert str(exc) == "optimizer.momentum must be a number, got 'x'\nFix: set momentum to a number"


@pytest.fixture
def bad_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text("def_nodez: 2\n")
    monkeypatch.setenv("CSRUN_SITE_CONFIG", str(path))
    return path


@pytest.mark.parametrize("main, prog", [(csrun_cpu.main, "csrun_cpu"), (csrun_wse.main, "csrun_wse"),
                                        (python_pt.main, "python-pt")])
def test_launchers_exit_2_on_a_bad_site_config(main, prog: str, bad_site: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dry-run", "true"] if prog != "python-pt" else ["-c", "pass"]) == 2
    err = capsys.readouterr().err
    assert f"{bad_site}: def_nodez: unknown key. Did you mean 'def_nodes'?" in err
    assert "Traceback" not in err


def test_run_py_exits_2_on_a_bad_params_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CS_IP", raising=False)
    monkeypatch.delenv("CSRUN_LAUNCHER", raising=False)
    params = tmp_path / "p.yaml"
    params.write_text("runconfig: {max_steps: 1, log_steps: 1}\nmodel: {mixed_precision: false}\n"
                      "optimizer: {optimizer_type: sgd, learning_rate: 0.1}\ntrain_input: {batch_size: 2, shufle: true}\n")
    torch_state.reset_for_tests()
    try:
        code = run(model_fn=lambda p: torch.nn.Linear(1, 1), train_input_fn=None, eval_input_fn=None,
                   model_config=ModelConfig, input_config=InputConfig,
                   argv=["--params", str(params), "--mode", "train", "--model_dir", str(tmp_path / "md")])
    finally:
        torch_state.reset_for_tests()
    assert code == 2
    err = capsys.readouterr().err
    assert "train_input.shufle: unknown key. Did you mean 'shuffle'?" in err and "Traceback" not in err
