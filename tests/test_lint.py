"""The lint and the type check: ``ruff`` (errors: syntax, undefined names, unused imports and
variables) over csrun/, tests/, bench/ and models/, and ``mypy`` over csrun/ (pyproject.toml's
``[tool.ruff]`` and ``[tool.mypy]``), both clean (issue 14).

Both come with the ``test`` extra (bin/csrun-setup installs it), so in CI they run like any test.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import REPO, VENV_BIN

pytestmark = pytest.mark.timeout(300)


def test_ruff_is_clean() -> None:
    done = subprocess.run([str(VENV_BIN / "ruff"), "check", "--no-cache", "--output-format", "concise",
                           "csrun", "tests", "bench", "models"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_is_clean() -> None:
    done = subprocess.run([str(VENV_BIN / "mypy"), "--cache-dir", "/dev/null"], cwd=REPO, capture_output=True,
                          text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
