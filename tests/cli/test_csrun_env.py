"""``csrun env``: the environment report, as text and JSON; ``csrun --version``."""

from __future__ import annotations

import json
import subprocess

import pytest

import csrun
from tests.conftest import BIN


def _csrun(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "csrun"), *args], capture_output=True, text=True, env=env, timeout=120)


def test_json_report_parses_and_names_netmod_mpi_and_site(slurm_env: dict[str, str]) -> None:
    done = _csrun("env", "--json", env=slurm_env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report) == {"csrun", "packages", "mpi", "slurm", "site", "settings", "gpu", "environment"}
    assert report["csrun"]["version"] == csrun.__version__
    assert report["mpi"]["netmod"].startswith("ofi")
    assert report["mpi"]["FI_PROVIDER"].startswith("tcp")
    assert "MPICH" in report["mpi"]["library"]
    assert report["packages"]["torch"].startswith("2.")
    assert report["slurm"]["controller"] == "answers"
    assert report["slurm"]["srun"].startswith("slurm")
    assert report["site"]["gres_resource"] == "cs:1"
    assert report["gpu"]["device_count"] == 0 or report["gpu"]["cuda_available"]


def test_a_chosen_netmod_and_site_overrides_are_reported(no_slurm_env: dict[str, str]) -> None:
    env = dict(no_slurm_env, MPIR_CVAR_CH4_NETMOD="ucx", CSRUN_GRES_NODE="n017")
    report = json.loads(_csrun("env", "--json", env=env).stdout)
    assert report["mpi"]["netmod"] == "MPIR_CVAR_CH4_NETMOD=ucx"
    assert report["site"]["gres_node"] == "n017"
    assert report["site"]["overridden_by"] == ["CSRUN_GRES_NODE"]
    assert report["environment"]["CSRUN_GRES_NODE"].startswith("n017  [site] the node that owns that resource")
    assert report["slurm"]["controller"].startswith("not available")


def test_text_report_has_every_section(no_slurm_env: dict[str, str]) -> None:
    done = _csrun("env", env=no_slurm_env)
    assert done.returncode == 0
    for section in ("[csrun]", "[packages]", "[mpi]", "[slurm]", "[site]", "[settings]", "[gpu]", "[environment]"):
        assert section in done.stdout


def test_version_and_a_bad_subcommand(no_slurm_env: dict[str, str]) -> None:
    done = _csrun("--version", env=no_slurm_env)
    assert done.returncode == 0 and done.stdout.strip() == f"csrun {csrun.__version__}"
    bad = _csrun("bogus", env=no_slurm_env)
    assert bad.returncode == 2 and "bogus" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("argv, prog", [
    (["csrun_wse"], "csrun_wse"), (["csrun_cpu"], "csrun_cpu"), (["cs_emulator"], "cs_emulator"),
    (["cs_convert_hdf5"], "cs_convert_hdf5"), (["python", "models/fc_mnist/run.py"], "run.py"),
])
def test_every_command_has_version(no_slurm_env: dict[str, str], argv: list[str], prog: str) -> None:
    from tests.conftest import REPO, VENV_BIN

    done = subprocess.run([str(VENV_BIN / argv[0]), *argv[1:], "--version"], env=no_slurm_env, capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{prog} (csrun {csrun.__version__})"
