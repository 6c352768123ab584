"""The registry of CSRUN_* variables: every one declared once, every bad knob one line, the README's table true."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from csrun.cli import csrun_cpu, csrun_wse
from csrun.cli.env_report import build_report
from csrun.cli.variables import every_variable, misspelt
from csrun.env_settings import EnvSettings, check_environment, env_name, env_settings
from csrun.errors import ConfigError
from csrun.program.execution import EXECUTION_STRATEGIES

ROOT = Path(__file__).resolve().parents[1]
FREE_TEXT = {"emulator_token", "emulator_ca", "emulator_tls_name", "site_config"}
"""Knobs any text fits (a path, a name, a secret): checked where they are used, not here."""


def _bad_value(f: dataclasses.Field) -> str:
    """A value the knob's type or bounds refuse."""
    tp = typing.get_type_hints(EnvSettings)[f.name]
    if tp in (float, int):
        return "abc"
    if tp is bool:
        return "maybe"
    return "bogus"


BAD = [(f.name, _bad_value(f)) for f in dataclasses.fields(EnvSettings) if f.name not in FREE_TEXT]


def test_free_text_knobs_are_only_the_declared_ones() -> None:
    strings = {f.name for f in dataclasses.fields(EnvSettings)
               if typing.get_type_hints(EnvSettings)[f.name] is str and not f.metadata.get("pattern")}
    assert strings == FREE_TEXT


@pytest.mark.parametrize("field,value", BAD)
def test_a_bad_knob_stops_csrun_wse_with_one_line_naming_it(
        field: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    name = env_name(field)
    monkeypatch.setenv(name, value)
    rc = csrun_wse.main(["--dry-run", "--total-nodes", "2", "python", "-c", "pass"])
    out, err = capsys.readouterr()
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"csrun_wse: error: {name}: '{value}' ")
    assert "unset it for the default" in lines[0]
    assert "Running" not in out  # nothing was started


@pytest.mark.parametrize("field,value", BAD[:3])
def test_a_bad_knob_stops_csrun_cpu_too(field: str, value: str, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(env_name(field), value)
    assert csrun_cpu.main(["--dry-run", "python", "-c", "pass"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"csrun_cpu: error: {env_name(field)}: '{value}' ")


def test_run_py_refuses_a_bad_knob_before_its_flags(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "CSRUN_STREAM_TIMEOUT": "0"}
    done = subprocess.run([sys.executable, "-c", "from csrun.run.runner import run; import sys; "
                           "sys.exit(run(model_fn=None, train_input_fn=None, eval_input_fn=None, argv=['--mode', 'train']))"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(
        "error: CSRUN_STREAM_TIMEOUT: '0' must be greater than 0 (seconds the chief waits for a batch before it "
        "names the streamer that is late; default 60; unset it for the default)")
    assert "Traceback" not in done.stderr


def test_cs_emulator_refuses_a_bad_knob(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "CSRUN_ENGINE_TRACE": "sometimes"}
    done = subprocess.run([sys.executable, "-m", "csrun.cli.cs_emulator", "--port", "0"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "cs_emulator: error: CSRUN_ENGINE_TRACE: 'sometimes' is not one of 'auto', 'off' (auto: the engine runs a "
        "checked TorchScript trace of the graph's forward; off: the graph as captured; default auto; unset it for "
        "the default)"]


def test_empty_is_the_default_and_a_change_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CSRUN_STREAM_TIMEOUT", "  ")
    assert env_settings().stream_timeout == 60.0
    monkeypatch.setenv("CSRUN_STREAM_TIMEOUT", "7.5")
    assert env_settings().stream_timeout == 7.5
    monkeypatch.setenv("CSRUN_PREEMPT_SIGNAL", "sigusr2")
    monkeypatch.setenv("CSRUN_PROGRESS", "LINES")
    assert env_settings().progress == "lines" and env_settings().stream_timeout == 7.5


@pytest.mark.parametrize("field,value,message", [
    ("mpi_init_timeout", "inf", "must be a finite number"),  # the MPI_Init watchdog cannot sleep forever
    ("connect_timeout", "nan", "is not a number"),
    ("slurm_probe_timeout", "0", "must be greater than 0"),  # 0 would make csrun_wse run locally, silently
    ("verify_steps", "-1", "must be at least 0"),
    ("max_idle_requeues", "0", "must be at least 1"),
    ("preempt_signal", "KILL", "is not a preemption signal"),
])
def test_bounds(field: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{env_name(field)}: '{value}' {message}"):
        env_settings({env_name(field): value})


def test_a_secret_is_never_shown() -> None:
    with pytest.raises(ConfigError) as caught:
        env_settings({"CSRUN_EMULATOR_TOKEN": "x" * 20, "CSRUN_GC_FREEZE": "maybe"})
    assert "x" * 20 not in str(caught.value)
    report = build_report({"CSRUN_EMULATOR_TOKEN": "s3cret-s3cret-s3cret", "CSRUN_STREAM_TIMEOUT": "abc",
                           "CSRUN_STREAM_TIMOUT": "5", "CSRUN_NOT_OURS": "1", "PATH": "/usr/bin:/bin"})
    section = report["environment"]
    assert "s3cret" not in repr(report)
    assert section["CSRUN_EMULATOR_TOKEN"].startswith("(set, hidden)  [knob]")
    assert section["CSRUN_STREAM_TIMEOUT"].startswith("abc  [knob] BAD: CSRUN_STREAM_TIMEOUT: 'abc' is not a number")
    assert section["unknown"] == ["CSRUN_NOT_OURS", "CSRUN_STREAM_TIMOUT (did you mean CSRUN_STREAM_TIMEOUT?)"]


def test_a_misspelt_variable_is_named_by_the_launchers(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert misspelt({"CSRUN_VERIFY_STEP": "0", "CSRUN_CHAOS_JOB": "1"}) == [
        "CSRUN_VERIFY_STEP is not a csrun setting (did you mean CSRUN_VERIFY_STEPS?); it has no effect"]
    monkeypatch.setenv("CSRUN_VERIFY_STEP", "0")
    assert csrun_cpu.main(["--dry-run", "python", "-c", "pass"]) == 0
    assert "csrun_cpu: warning: CSRUN_VERIFY_STEP is not a csrun setting (did you mean CSRUN_VERIFY_STEPS?)" \
        in capsys.readouterr().err


def test_every_csrun_name_in_the_code_is_registered() -> None:
    known = {v.name for v in every_variable()}
    assert len(known) == len(every_variable()), "a variable is declared twice"
    used: dict[str, str] = {}
    files = [*ROOT.joinpath("csrun").rglob("*.py"), *ROOT.joinpath("bin").iterdir(), ROOT / "slurm" / "local-cluster"]
    for path in files:
        for name in re.findall(r"\bCSRUN_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")):
            used.setdefault(name, str(path.relative_to(ROOT)))
    assert {n: p for n, p in used.items() if n not in known} == {}


def test_the_readme_table_is_the_registry() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(CSRUN_\w+)` \| (\w+) \| (?:`([^`]*)`|-) \| (.+) \|$", section, re.M)
    assert [(n, k, d) for n, k, d, _ in rows] == [(v.name, v.kind, v.default) for v in every_variable()]
    assert [doc for *_, doc in rows] == [v.doc.replace("|", "/") for v in every_variable()]


def test_the_strategies_are_the_knobs_choices() -> None:
    hint = typing.get_type_hints(EnvSettings)["execution_strategy"]
    assert typing.get_args(typing.get_args(hint)[0]) == EXECUTION_STRATEGIES


ODD = ["abc", "", "-1", "1e999", "nan", "\x01", " 5 ", "9" * 400]


def test_every_knob_with_any_odd_value_is_one_line_or_accepted() -> None:
    """A fuzz of every CSRUN_ knob: a value is read or refused with a ConfigError naming it, never a traceback."""
    refused = 0
    for f in dataclasses.fields(EnvSettings):
        for value in ODD:
            try:
                check_environment({env_name(f.name): value})
            except ConfigError as exc:
                assert "\n" not in str(exc) and env_name(f.name) in str(exc), str(exc)
                refused += 1
    assert refused >= len(BAD) * 3
