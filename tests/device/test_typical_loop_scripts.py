"""The seed blog's typical loop (loss outside the model) in every launch mode: one task, mpiexec,
csrun_wse on the local cluster, --compile_only, --validate_only; device losses equal eager CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BIN

pytestmark = pytest.mark.timeout(180)

SCRIPT = Path(__file__).parent / "scripts" / "typical_loop.py"
MPIEXEC = Path(sys.executable).parent / "mpiexec"
STEPS = 30


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "CS_IP", "CSRUN_LAUNCHER")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return {**env, **(extra or {})}


def run(tmp_path: Path, name: str, *args: str, prefix: list[str] | None = None,
        env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / f"{name}.json"
    cmd = [*(prefix or [sys.executable]), str(SCRIPT), str(out), "--model_dir", str(tmp_path / f"md_{name}"),
           "--steps", str(STEPS), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env or _env(), timeout=170, cwd=tmp_path)
    return done, (json.loads(out.read_text()) if out.exists() else {})


@pytest.fixture(scope="module")
def eager(tmp_path_factory: pytest.TempPathFactory) -> dict:
    done, result = run(tmp_path_factory.mktemp("cpu"), "cpu")
    assert done.returncode == 0, done.stderr
    assert len(result["losses"]) == STEPS
    return result


@pytest.fixture(scope="module")
def eager_streamed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Eager CPU on the chief, batches from two streamers (their round-robin order)."""
    done, result = run(tmp_path_factory.mktemp("cpu3"), "cpu3", prefix=[str(MPIEXEC), "-n", "3", sys.executable])
    assert done.returncode == 0, done.stderr
    assert result["streamers"] == 2 and len(result["losses"]) == STEPS
    return result


def _same_training(device: dict, eager: dict) -> None:
    assert len(device["losses"]) == STEPS and device["global_step"] == STEPS
    assert device["losses"] == pytest.approx(eager["losses"], abs=1e-6)
    assert device["accuracies"] == pytest.approx(eager["accuracies"], abs=1e-6)
    assert device["fc1"] == pytest.approx(eager["fc1"], abs=1e-5)


def test_one_task_on_the_embedded_device(tmp_path: Path, eager: dict) -> None:
    done, result = run(tmp_path, "dev", "--cs_ip", "embedded")
    assert done.returncode == 0, done.stderr
    _same_training(result, eager)


def test_mpiexec_three_tasks_two_streamers(tmp_path: Path, eager_streamed: dict) -> None:
    done, result = run(tmp_path, "mpi", "--cs_ip", "embedded", prefix=[str(MPIEXEC), "-n", "3", sys.executable])
    assert done.returncode == 0, done.stderr
    assert result["streamers"] == 2
    _same_training(result, eager_streamed)


@pytest.mark.slurm
def test_csrun_wse_three_nodes_on_the_local_cluster(tmp_path: Path, eager_streamed: dict,
                                                     slurm_env: dict[str, str]) -> None:
    done, result = run(tmp_path, "wse", prefix=[str(BIN / "csrun_wse"), "--total-nodes", "3", str(BIN / "python-pt")],
                       env={**slurm_env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0, done.stdout + done.stderr
    assert result["streamers"] == 2
    _same_training(result, eager_streamed)


@pytest.mark.parametrize("flag,message,artifact", [
    ("--compile_only", "Compile for training completed successfully!", True),
    ("--validate_only", "Validation completed successfully!", False),
])
def test_compile_only_and_validate_only(tmp_path: Path, flag: str, message: str, artifact: bool) -> None:
    done, result = run(tmp_path, "c", flag)
    assert done.returncode == 0, done.stderr
    assert message in done.stdout
    assert result == {}  # the run stops after the first step's compile
    assert any((tmp_path / "md_c").glob("cs_*/COMPLETE")) == artifact
