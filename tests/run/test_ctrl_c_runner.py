"""Ctrl-C on run.py means "save a checkpoint at the next step and stop", under csrun_cpu as under csrun_wse.

The SIGINT goes to the whole process group, as a terminal's Ctrl-C does, so the command gets it
from the "terminal" and again from csrun_cpu, which passes signals on: one Ctrl-C all the same.
The first: one line saying so, a checkpoint, exit 130, no traceback; a second one while that is
pending stops at once (exit 130), and one that lands as the stopped run exits changes nothing
(exit 130, no traceback). Before, a Ctrl-C under csrun_cpu (or plain python) saved
nothing (issue 34 item 5).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO, follow, long_debug_params

pytestmark = pytest.mark.timeout(180)


def run_and_interrupt(env: dict[str, str], params: Path, md: Path, times: int,
                      again_at: str = "") -> tuple[int, str]:
    """csrun_cpu running fc_mnist, its process group SIGINTed ``times`` times (0.6 s apart) once it logs a
    step; and once more when a line holding ``again_at`` comes (when given)."""
    pending = [times]
    again = [again_at] if again_at else []

    def on_line(line: str, proc: subprocess.Popen[str]) -> None:
        if pending and "| Train: step" in line:
            for i in range(pending.pop()):
                time.sleep(0.6 * bool(i))
                os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: csrun_cpu and its command both get it
        if again and again[0] in line:
            again.clear()
            os.killpg(proc.pid, signal.SIGINT)

    argv = [str(BIN / "csrun_cpu"), "--alloc-node", "False", str(BIN / "python-pt"),
            str(REPO / "models" / "fc_mnist" / "run.py"), "--mode", "train", "--params", str(params), "-o", str(md), "--cpu"]
    return follow(argv, env, on_line)


def test_ctrl_c_under_csrun_cpu_saves_then_stops(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    _, params = long_debug_params(tmp_path)
    md = tmp_path / "md"
    code, output = run_and_interrupt(no_slurm_env, params, md, 1)
    assert code == 130, output[-3000:]
    assert "interrupted (Ctrl-C): saving a checkpoint at the next step" in output
    assert "stopped by SIGINT at global step" in output and "checkpoint saved. Continue with --resume." in output
    assert "Traceback" not in output, output[-3000:]
    assert len(list(md.glob("checkpoint_*.mdl"))) == 1


def test_a_second_ctrl_c_stops_at_once(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    _, params = long_debug_params(tmp_path)
    code, output = run_and_interrupt(no_slurm_env, params, tmp_path / "md", 2)
    assert code == 130, output[-3000:]
    assert "Traceback" not in output, output[-3000:]


def test_a_second_ctrl_c_as_the_stopped_run_exits_changes_nothing(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    _, params = long_debug_params(tmp_path)
    md = tmp_path / "md"
    code, output = run_and_interrupt(no_slurm_env, params, md, 1, again_at="checkpoint saved. Continue with --resume.")
    assert code == 130, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert len(list(md.glob("checkpoint_*.mdl"))) == 1
