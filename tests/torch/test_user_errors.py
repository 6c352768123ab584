"""A csrun user error that ends a script is one line naming the script's own line; a bug keeps its traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import base_env


@pytest.mark.parametrize("body, says, traceback", [
    ('import csrun.pytorch as cstorch\ncstorch.backend("GPU")\n',
     "script.py: error: cstorch.backend('GPU'): csrun has no GPU backend", False),
    ("import csrun.torch as cbtorch\ncbtorch.module(object())\n",
     "script.py: error: cbtorch.module() needs a torch.nn.Module", False),
    ('import csrun.pytorch\nraise ValueError("a bug")\n', "ValueError: a bug", True),
])
def test_a_user_error_is_one_line_and_a_bug_a_traceback(tmp_path: Path, body: str, says: str,
                                                         traceback: bool) -> None:
    script = tmp_path / "script.py"
    script.write_text(body)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env=base_env(), cwd=tmp_path)
    assert done.returncode == 1
    assert says in done.stderr and ("Traceback" in done.stderr) is traceback, done.stderr
    if not traceback:
        assert done.stderr.strip().count("\n") == 0 and f"(at {script}:2)" in done.stderr
