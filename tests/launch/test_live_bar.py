"""csrun_wse draws the chief's progress bar on its own terminal (issue 34 item 2).

csrun_wse runs on a pseudo-terminal, as from a shell: while fc_mnist trains under mpiexec (the
chief's stdout a pipe, so the chief itself prints calm lines) the launcher's terminal shows a bar
with the step, loss, samples/s and ETA, moving, below the chief's lines; with
``CSRUN_PROGRESS=lines`` it draws none. Before, the bar never drew under csrun_wse.
"""

from __future__ import annotations

import os
import pty
import re
import select
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, REPO

pytestmark = pytest.mark.timeout(240)
STEPS = 3000


def on_a_terminal(env: dict[str, str], params: Path, md: Path) -> tuple[int, str]:
    pid, fd = pty.fork()
    if pid == 0:  # csrun_wse, a session leader on the pty as a shell's job
        os.execve(str(BIN / "csrun_wse"), [str(BIN / "csrun_wse"), "--total-nodes", "3", str(BIN / "python-pt"),
                                           str(REPO / "models" / "fc_mnist" / "run.py"), "--mode", "train", "--params",
                                           str(params), "-o", str(md)], env)
    out = b""
    deadline = time.monotonic() + 200
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the terminal's other end closed: csrun_wse ended
                    break
                if not chunk:
                    break
                out += chunk
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))


@pytest.fixture()
def long_params(tmp_path: Path) -> Path:
    doc = yaml.safe_load((REPO / "configs" / "fc_mnist_debug.yaml").read_text())
    doc["runconfig"].update(max_steps=STEPS, checkpoint_steps=0, log_steps=1000)
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_launchers_terminal_shows_the_chiefs_bar(no_slurm_env: dict[str, str], long_params: Path,
                                                    tmp_path: Path) -> None:
    env = {**no_slurm_env, "TERM": "xterm", "COLUMNS": "120", "OMP_NUM_THREADS": "1"}
    code, screen = on_a_terminal(env, long_params, tmp_path / "md")
    assert code == 0, screen[-3000:]
    frames = re.findall(r"train \S* (\d+)/3000 loss \S+ (\d+) samples/s ETA (\d+:\d\d:\d\d)", screen)
    assert frames, screen[-3000:]
    assert any(int(step) < STEPS for step, _, _ in frames) and any(int(step) == STEPS for step, _, _ in frames)
    assert "| Train: step 1000/3000" in screen and "Run summary (train)" in screen  # the chief's lines, above it


def test_no_bar_with_progress_lines(no_slurm_env: dict[str, str], long_params: Path, tmp_path: Path) -> None:
    env = {**no_slurm_env, "TERM": "xterm", "COLUMNS": "120", "OMP_NUM_THREADS": "1", "CSRUN_PROGRESS": "lines"}
    code, screen = on_a_terminal(env, long_params, tmp_path / "md")
    assert code == 0, screen[-3000:]
    assert "samples/s ETA" not in screen and "| Train: step 3000/3000" in screen
