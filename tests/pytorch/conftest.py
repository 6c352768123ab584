"""Fixtures for the 2.x API tests: the slides' scripts run as a user runs them (a subprocess), the
eager torch runs they must equal, a cs_emulator in this process, and a fresh API state for
in-process tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch

from csrun.emulator.remote.server import EmulatorServer
from csrun.pytorch import backends as cstorch_backend
from csrun.torch import backend as backend_mod
from csrun.torch import process_state as state_mod
from csrun.driver.driver import DeviceDriver
from tests.conftest import REPO, base_env
from tests.pytorch.scripts import tiny

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SLIDE_TRAIN = SCRIPTS / "slide_train.py"
SLIDE_SKELETON = SCRIPTS / "slide_skeleton.py"
TRAIN_CSTORCH = REPO / "models" / "fc_mnist" / "train_cstorch.py"
DEBUG_YAML = REPO / "configs" / "fc_mnist_debug.yaml"
TOKEN = "cstorch-test-token"


def run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (a script and its arguments, or a launcher line) with the repo's environment."""
    done = subprocess.run(argv, cwd=cwd, env=base_env(OMP_NUM_THREADS="1", **env), capture_output=True, text=True,
                          timeout=900)  # a deadline for a hang only: a busy machine takes its time
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def python(script: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``python script args...`` in ``cwd``."""
    return run([sys.executable, str(script), *args], cwd, **env)


def read_losses(path: Path) -> list[float]:
    """One float per line."""
    return [float(v) for v in path.read_text().split()]


def epoch(streamers: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of the scripts' batches in the order the chief gets them: the loader's own as one
    task; with S streamers, streamer k's shard is samples k, k+S, ... batched alike, taken round-robin
    (csrun.torch.sharding's rule)."""
    if streamers <= 1:
        return list(tiny.get_train_dataloader())
    x, y = tiny.dataset().tensors
    shards = [list(range(k, len(x), streamers)) for k in range(streamers)]
    per_shard = len(shards[0]) // tiny.BATCH
    order = [shard[j * tiny.BATCH:(j + 1) * tiny.BATCH] for j in range(per_shard) for shard in shards]
    return [(x[idx], y[idx]) for idx in order]


def eager_slide_train(streamers: int = 0) -> list[float]:
    """slide_train.py's loop in plain eager torch: the losses of its 30 steps."""
    torch.manual_seed(0)
    model = tiny.Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.NLLLoss()
    losses = []
    for x, y in epoch(streamers):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def eager_skeleton(steps: int, streamers: int = 0) -> tuple[list[float], dict[str, torch.Tensor]]:
    """slide_skeleton.py's loop (SGD momentum 0.9, lr 0.05 -> 0.005 linearly over 1000 steps, global
    norm clipped to 1.0) in plain eager torch: losses and the weights after ``steps`` steps."""
    torch.manual_seed(0)
    model = tiny.Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.NLLLoss()
    losses: list[float] = []
    while len(losses) < steps:
        for x, y in epoch(streamers):
            if len(losses) == steps:
                break
            for g in opt.param_groups:
                g["lr"] = 0.05 + (0.005 - 0.05) * len(losses) / 1000
            loss = loss_fn(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture()
def emulator() -> Iterator[str]:
    """A cs_emulator server in this process; yields its ``HOST:PORT`` (scripts get the token by env)."""
    srv = EmulatorServer(token=TOKEN, port=0)
    srv.start()
    yield f"127.0.0.1:{srv.address[1]}"
    srv.shutdown()


@pytest.fixture()
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A lone chief with a fresh cbtorch and cstorch state (in-process tests)."""
    for name in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID",
                 "SLURM_NTASKS", "SLURM_HET_SIZE", "CS_IP", "CSRUN_LAUNCHER"):
        monkeypatch.delenv(name, raising=False)
    state_mod.reset_for_tests()
    cstorch_backend.reset_for_tests()
    backend_mod.register_device_backend(DeviceDriver)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    state_mod.reset_for_tests()
    cstorch_backend.reset_for_tests()
    torch.set_num_threads(old)
