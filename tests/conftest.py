"""Shared fixtures: the repository paths, the venv's tools, and the local Slurm cluster.

Tests marked ``slurm`` need the cluster that ``slurm/local-cluster start`` brings up. Locally
they skip, with the reason, when it is not running; under ``CI=true`` a missing cluster is a
failure, because CI starts it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / "bin"
VENV_BIN = Path(sys.executable).parent
CLUSTER_SCRIPT = REPO / "slurm" / "local-cluster"


def base_env(**extra: str) -> dict[str, str]:
    """The environment a test gives a launcher: the venv's bin first, the repo importable."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONPATH"] = str(REPO)
    env["CSRUN_PYTHON"] = sys.executable
    env.pop("CS_IP", None)
    env.update(extra)
    return env


def _cluster_conf() -> tuple[str | None, str]:
    if not CLUSTER_SCRIPT.exists():
        return None, "slurm/local-cluster is missing"
    try:
        done = subprocess.run([str(CLUSTER_SCRIPT), "status"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"slurm/local-cluster status failed: {exc}"
    if done.returncode != 0:
        return None, "the local Slurm cluster is not running (start it with: slurm/local-cluster start --workers 4 --systems 2)"
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("export SLURM_CONF="):
            return line.split("=", 1)[1].strip().strip("'\""), ""
    return None, "slurm/local-cluster status printed no SLURM_CONF"


@pytest.fixture(scope="session", autouse=True)
def torch_imported_on_the_main_thread() -> None:
    """torch's lazy modules (dynamo, the program reader) imported once, before any test starts an
    in-process cs_emulator: its warm-up thread imports the reader while a test's main thread would
    import dynamo (an optimizer's first construction), and torch's circular modules imported from
    two threads at once can each see the other's half-initialised module."""
    import torch._dynamo  # noqa: F401
    import torch._export.serde.serialize  # noqa: F401


@pytest.fixture(scope="session")
def slurm_conf() -> str:
    """The running local cluster's slurm.conf path (skip locally, fail in CI, when there is none)."""
    conf, why = _cluster_conf()
    if conf is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must have the local Slurm cluster: {why}")
        pytest.skip(why)
    return conf


@pytest.fixture()
def slurm_env(slurm_conf: str) -> dict[str, str]:
    """An environment whose srun/sbatch talk to the local cluster."""
    return base_env(SLURM_CONF=slurm_conf)


@pytest.fixture()
def no_slurm_env(tmp_path: Path) -> dict[str, str]:
    """An environment with no Slurm commands on PATH (only the venv and core system tools)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("bash", "env", "true", "false", "sleep", "cat", "python3", "readlink", "dirname"):
        for folder in ("/usr/bin", "/bin"):
            if os.path.exists(f"{folder}/{name}"):
                os.symlink(f"{folder}/{name}", tools / name)
                break
    env = base_env()
    env["PATH"] = f"{VENV_BIN}:{tools}"
    env.pop("SLURM_CONF", None)
    return env


def read_probes(out: Path) -> dict[int, dict]:
    """The evidence task_probe.py left: rank -> its record."""
    import json

    return {int(p.stem.split("_")[1]): json.loads(p.read_text()) for p in out.glob("rank_*.json")}


PROBE = REPO / "tests" / "scripts" / "task_probe.py"


def long_debug_params(tmp_path: Path) -> tuple[dict, Path]:
    """fc_mnist's debug params made to run far longer than any test waits (100000 steps, no
    periodic checkpoints), written to ``tmp_path/long.yaml``: (the params, the file). For the
    preemption tests, local and on the cluster, that stop a run part way."""
    import yaml

    params = yaml.safe_load((REPO / "configs" / "fc_mnist_debug.yaml").read_text())
    params["runconfig"].update(max_steps=100000, checkpoint_steps=0, log_steps=200)
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(params))
    return params, path


def follow(argv: Sequence[str], env: dict[str, str], on_line: Callable[[str, subprocess.Popen[str]], None], *,
           timeout: float = 60,
           cwd: Path | None = None) -> tuple[int, str]:
    """Run ``argv`` in a session of its own, stdout and stderr merged; ``on_line(line, process)`` sees each
    line as it comes (to signal or kill something at a point of the run). Returns the exit code and the whole
    output; the process group is SIGKILLed if it outlives the test."""
    proc = subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=cwd)
    assert proc.stdout is not None
    out: list[str] = []
    try:
        for line in proc.stdout:
            out.append(line)
            on_line(line, proc)
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, "".join(out)
