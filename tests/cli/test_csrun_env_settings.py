"""``csrun env`` lists every setting in effect: each CSRUN_* knob, set or default, and CS_IP (issue 34, item 7.7)."""

from __future__ import annotations

import dataclasses
import json
import subprocess

from csrun.cli.variables import settings_section
from csrun.env_settings import EnvSettings, env_name

from tests.conftest import BIN


def test_every_knob_and_cs_ip_are_listed_with_their_source() -> None:
    section = settings_section({"CSRUN_PROGRESS": "lines", "CSRUN_STREAM_TIMEOUT": "2.5", "CS_IP": "10.0.0.5:9000"})
    assert list(section) == [env_name(f.name) for f in dataclasses.fields(EnvSettings)] + ["CS_IP"]
    assert section["CSRUN_PROGRESS"] == "lines  (set)"
    assert section["CSRUN_STREAM_TIMEOUT"] == "2.5  (set)"
    assert section["CSRUN_VERIFY_STEPS"] == "1  (default)"
    assert section["CSRUN_GC_FREEZE"] == "on  (default)"
    assert section["CSRUN_EXECUTION_STRATEGY"] == "none  (default)"
    assert section["CS_IP"].startswith("10.0.0.5:9000  (set")


def test_unset_cs_ip_a_bad_knob_and_a_secret() -> None:
    section = settings_section({"CSRUN_MPI_INIT_TIMEOUT": "soon", "CSRUN_EMULATOR_TOKEN": "s3cr3t-token-value",
                                "CSRUN_PROGRESS": ""})
    assert section["CS_IP"].startswith("none  (unset")
    assert section["CSRUN_MPI_INIT_TIMEOUT"].startswith("BAD: CSRUN_MPI_INIT_TIMEOUT: 'soon'")
    assert section["CSRUN_EMULATOR_TOKEN"] == "hidden  (set)"
    assert "s3cr3t" not in json.dumps(section)
    assert section["CSRUN_PROGRESS"] == "auto  (default)"  # empty: the default
    assert settings_section({})["CSRUN_EMULATOR_TOKEN"] == "none  (default)"


def test_csrun_env_prints_the_settings(no_slurm_env: dict[str, str]) -> None:
    env = dict(no_slurm_env, CS_IP="127.0.0.1:9000", CSRUN_CONNECT_TIMEOUT="3", CSRUN_EMULATOR_TOKEN="s3cr3t-token-value")
    done = subprocess.run([str(BIN / "csrun"), "env", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    settings = json.loads(done.stdout)["settings"]
    assert settings["CS_IP"].startswith("127.0.0.1:9000  (set")
    assert settings["CSRUN_CONNECT_TIMEOUT"] == "3  (set)" and settings["CSRUN_STREAM_TIMEOUT"] == "60  (default)"
    assert "s3cr3t" not in done.stdout
    text = subprocess.run([str(BIN / "csrun"), "env"], capture_output=True, text=True, env=env, timeout=120).stdout
    section = text.split("[settings]\n", 1)[1].split("\n[", 1)[0].splitlines()
    assert any(line.split() == ["CS_IP", "127.0.0.1:9000", "(set:", "run.py's", "--cs_ip", "default)"] for line in section)
    assert any(line.split()[:3] == ["CSRUN_VERIFY_STEPS", "1", "(default)"] for line in section)
