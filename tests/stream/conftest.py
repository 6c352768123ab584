"""Fixtures for the stream tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

MPIEXEC = Path(sys.executable).parent / "mpiexec"


@pytest.fixture(scope="session")
def mpiexec() -> Path:
    """The venv's mpiexec (skip the MPI tests without it)."""
    if not MPIEXEC.exists():
        pytest.skip(f"no mpiexec next to {sys.executable}")
    return MPIEXEC
