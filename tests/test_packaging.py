"""csrun as its users get it (issue 34, item 7): the wheel built from this tree, installed into a
fresh venv, runs the README's main job from a folder outside the checkout.

The venv is a fresh one (no system site packages). torch goes in first as bin/csrun-setup puts
it in (``pip install torch==2.13.0``: this machine's pip finds the CPU wheel on its disk, about
20 s); the wheel's own ``torch>=2.13,<2.14`` must then keep that CPU build. The wheel is
installed with the ``mpi`` extra only (mpiexec for a job without Slurm): tensorboard must come
from its plain dependencies, since every run writes TensorBoard events. The job is the README's
first command at debug size (fc_mnist's folder copied out: ``models/`` is not in the wheel),
trained 20 steps through ``csrun_wse`` and ``python-pt`` on the embedded emulator, then evaluated. No
Slurm on PATH, no ``PYTHONPATH``, ``HOME`` a fresh folder: the site config is the built-in
defaults (no ``/etc/csrun/site.yaml`` and no checkout beside the installed package).
About a minute; it runs in CI like any test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

TORCH_PIN = "torch==2.13.0"
"""What bin/csrun-setup installs first (the CPU wheel on this machine's disk)."""
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "csrun")
"""What the wheel is built from (pyproject's packages, readme and license); nothing else of the tree."""
TOOLS = ("bash", "sh", "env", "cat", "readlink", "dirname", "uname", "hostname", "ps")
"""The system tools the job may call; Slurm's commands are not among them."""


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


def _clean_env(tmp_path: Path, path: str) -> dict[str, str]:
    """This process's environment without csrun's, Python's and Slurm's variables; HOME a fresh folder."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CSRUN_", "SLURM_", "PYTHON", "XDG_", "VIRTUAL_ENV", "PMI", "MPIR_", "FI_"))
           and k not in ("CS_IP", "COLUMNS")}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), PATH=path)
    return env


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel of a copy of the tree's sources (the build writes into the copy, not the checkout)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
         cwd=tmp_path, env=dict(os.environ), timeout=300)
    (wheel,) = dist.glob("csrun-*.whl")
    return wheel


@pytest.mark.timeout(600)
def test_the_wheel_in_a_fresh_venv_runs_the_main_job(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "csrun/cli/csrun_wse.py" in names and "csrun/py.typed" in names
    assert not any(n.startswith(("models/", "configs/", "tests/")) for n in names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    plain = {r.split(";")[0].replace(" ", "") for r in requires if "extra ==" not in r}
    assert "torch<2.14,>=2.13" in plain and "tensorboard" in plain, requires

    venv = tmp_path / "venv"
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in TOOLS:
        found = shutil.which(name, path="/usr/bin:/bin")
        if found:
            os.symlink(found, tools / name)
    env = _clean_env(tmp_path, f"{venv / 'bin'}:{tools}")
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path, env=env, timeout=120)
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, TORCH_PIN], cwd=tmp_path, env=env, timeout=300)  # as bin/csrun-setup does: the CPU wheel
    torch_before = _run([py, "-c", "import torch; print(torch.__version__)"], cwd=tmp_path, env=env, timeout=120).stdout
    _run([*pip, f"{wheel}[mpi]"], cwd=tmp_path, env=env, timeout=300)
    torch_after = _run([py, "-c", "import torch; print(torch.__version__)"], cwd=tmp_path, env=env, timeout=120).stdout
    assert torch_after == torch_before, "installing csrun replaced the torch build that was there"

    job = tmp_path / "job"
    shutil.copytree(REPO / "models" / "fc_mnist", job / "fc_mnist", ignore=shutil.ignore_patterns("__pycache__", "model_dir"))
    (job / "configs").mkdir()
    shutil.copy2(REPO / "configs" / "fc_mnist_debug.yaml", job / "configs")

    report = json.loads(_run([str(venv / "bin" / "csrun"), "env", "--json"], cwd=job, env=env, timeout=120).stdout)
    assert Path(report["csrun"]["location"]).is_relative_to(venv), report["csrun"]
    assert report["site"]["file"] == "defaults" and report["site"]["gres_resource"] == "cs:1", report["site"]
    assert report["packages"]["tensorboard"] != "not installed"

    md = job / "model_dir" / "fc_mnist"
    main_job = ["csrun_wse", "--total-nodes", "1", "python-pt", "fc_mnist/run.py", "--params", "configs/fc_mnist_debug.yaml",
                "-o", str(md)]
    # 20 steps: the debug config's log_steps, where the first TensorBoard scalars are written
    train = _run([*main_job, "--mode", "train", "--max_steps", "20"], cwd=job, env=env, timeout=300)
    assert (md / "checkpoint_20.mdl").is_file(), train.stdout[-3000:]
    evaluated = _run([*main_job, "--mode", "eval"], cwd=job, env=env, timeout=300)
    assert "Eval. accuracy = " in evaluated.stdout + evaluated.stderr, evaluated.stdout[-3000:]
    for mode in ("train", "eval"):
        assert list((md / mode).glob("events.out.tfevents.*")), f"no TensorBoard events in {mode}/"
    assert str(REPO) not in train.stdout + train.stderr + evaluated.stdout + evaluated.stderr
