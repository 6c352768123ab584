"""Fixtures for the device-path tests: a lone chief, the device backend installed, a model_dir."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from csrun.torch import backend as backend_mod
from csrun.torch import process_state as state_mod
from csrun.driver.driver import DeviceDriver

_ENV = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
        "SLURM_HET_SIZE", "CS_IP", "CSRUN_LAUNCHER")


@pytest.fixture(autouse=True)
def lone_chief(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts as a lone chief with a fresh user-API state and the device backend."""
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    state_mod.reset_for_tests()
    backend_mod.register_device_backend(DeviceDriver)
    yield
    state_mod.reset_for_tests()
    backend_mod.register_device_backend(DeviceDriver)


@pytest.fixture()
def model_dir(tmp_path: Path) -> str:
    """A fresh model_dir for compile artifacts."""
    return str(tmp_path / "model_dir")
