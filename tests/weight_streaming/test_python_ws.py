"""python-ws: the weight-streaming build's wrapper: argv with and without a container, and what it selects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from csrun.errors import ConfigError
from csrun.launch.container import PYTHON_PT, PYTHON_WS, container_plan
from csrun.program.execution import EXECUTION_STRATEGY_ENV
from csrun.run.cli_args import parse_args
from csrun.site import SiteConfig, load_site_config
from tests.conftest import BIN, base_env

ARGS = ["run.py", "-m", "train", "-p", "configs/gpt3_debug.yaml"]


def plan(site: SiteConfig, *, build=PYTHON_WS, runtime: str | None = "/usr/bin/apptainer", gpus: bool = False,
         environ: dict[str, str] | None = None, multi_task: bool = False):  # noqa: ANN001, ANN202
    return container_plan(ARGS, site, environ or {}, runtime=runtime, gpus=gpus, cwd="/work", multi_task=multi_task,
                          build=build)


def test_container_argv_uses_the_ws_image_and_selects_weight_streaming() -> None:
    site = SiteConfig(image="/sif/pt.sif", ws_image="/sif/ws.sif", mount_dirs=("/data", "/work"))
    p = plan(site, gpus=True, environ={"PYTHONPATH": "/host", "HOME": "/h"}, multi_task=True)
    assert p.argv == ["/usr/bin/apptainer", "exec", "--nv", "--env", f"{EXECUTION_STRATEGY_ENV}=weight_streaming",
                      "--bind", "/data,/work", "/sif/ws.sif", "python3", "-m", "mpi4py", *ARGS]
    assert p.unset == ("PYTHONPATH",) and p.setenv == {EXECUTION_STRATEGY_ENV: "weight_streaming"}
    assert p.notices == ["python-ws: unset PYTHONPATH for the container"]
    pt = plan(site, build=PYTHON_PT)  # python-pt: its own image, nothing selected
    assert pt.argv == ["/usr/bin/apptainer", "exec", "--bind", "/data,/work", "/sif/pt.sif", "python3", *ARGS]
    assert pt.setenv == {}


def test_ws_image_falls_back_to_the_image_and_the_binds_rule_is_python_pts() -> None:
    p = plan(SiteConfig(image="/sif/both.sif"))
    assert p.argv[-len(ARGS) - 2:] == ["/sif/both.sif", "python3", *ARGS]
    assert p.notices == ["python-ws: warning: the only bind is the current directory (/work); add data paths with "
                         "--mount-dirs or the site's mount_dirs"]


@pytest.mark.parametrize("site,runtime,why", [
    (SiteConfig(), "/usr/bin/apptainer", "no container image configured (site 'ws_image' / CSRUN_WS_IMAGE or site "
                                         "'image' / CSRUN_IMAGE)"),
    (SiteConfig(ws_image="/sif/ws.sif"), None, "no apptainer or singularity on PATH for image /sif/ws.sif"),
])
def test_no_container_runs_this_python_and_still_selects(site: SiteConfig, runtime: str | None, why: str) -> None:
    p = plan(site, runtime=runtime)
    assert p.argv == [sys.executable, *ARGS]
    assert p.setenv == {EXECUTION_STRATEGY_ENV: "weight_streaming"} and p.unset == ()
    assert p.notices == [f"python-ws: {why}; running {sys.executable}"]


def test_site_ws_image_from_the_environment() -> None:
    assert load_site_config({"CSRUN_WS_IMAGE": "/sif/ws.sif", "CSRUN_SITE_CONFIG": ""}).ws_image == "/sif/ws.sif"


def test_python_ws_execs_the_command_with_weight_streaming_selected(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text("import os, sys\nprint(os.environ.get('CSRUN_EXECUTION_STRATEGY'), sys.argv[1:])\n")
    env = base_env(CSRUN_IMAGE="", CSRUN_WS_IMAGE="")
    done = subprocess.run([str(BIN / "python-ws"), str(script), "a", "b"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "weight_streaming ['a', 'b']"
    assert "python-ws: no container image configured" in done.stderr
    done = subprocess.run([str(BIN / "python-pt"), str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "None []"


def test_run_py_takes_the_strategy_from_flag_then_environment_then_yaml() -> None:
    ws = {EXECUTION_STRATEGY_ENV: "weight_streaming"}
    assert parse_args(["-p", "x", "-m", "train"], environ=ws).execution_strategy == "weight_streaming"
    assert parse_args(["-p", "x", "-m", "train", "--execution_strategy", "pipeline"], environ=ws).execution_strategy == "pipeline"
    assert parse_args(["-p", "x", "-m", "train"], environ={}).execution_strategy is None  # the YAML key decides


def test_a_bad_strategy_in_the_environment_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError) as exc:  # run.py prints it as one 'run.py: error: ...' line, exit 2
        parse_args(["-p", "x", "-m", "train"], environ={EXECUTION_STRATEGY_ENV: "streaming"})
    assert exc.value.exit_code == 2 and "\n" not in str(exc.value)
    assert str(exc.value).startswith("CSRUN_EXECUTION_STRATEGY: 'streaming' is not one of 'pipeline', 'weight_streaming'")
