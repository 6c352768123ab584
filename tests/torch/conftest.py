"""Fixtures of the user-API tests."""

from __future__ import annotations

from typing import Iterator

import pytest

from csrun.torch import backend as backend_mod
from csrun.torch import process_state as state_mod

LAUNCH_VARIABLES = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID",
                    "SLURM_NTASKS", "SLURM_HET_SIZE")


@pytest.fixture()
def lone_chief(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as a lone chief (no launcher's rank variables), with fresh state and no device
    backend installed; both restored after the test."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    state_mod.reset_for_tests()
    installed = backend_mod.device_factory()
    backend_mod.register_device_backend(None)
    yield
    state_mod.reset_for_tests()
    backend_mod.register_device_backend(installed)
