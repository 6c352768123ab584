"""Fixtures for the stream tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

MPIEXEC = Path(sys.executable).parent / "mpiexec"


@pytest.fixture(scope="session")
def mpiexec() -> Path:
    """The venv's mpiexec (skip the MPI tests without it locally; fail in CI)."""
    if not MPIEXEC.exists():
        why = f"no mpiexec next to {sys.executable} (install the mpi extra: pip install -e .[mpi])"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must have MPI: {why}")
        pytest.skip(why)
    return MPIEXEC
