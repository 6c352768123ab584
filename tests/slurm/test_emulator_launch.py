"""csrun_wse --emulator on the real cluster: a cs_emulator per job on the chief's node, stopped after."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO
from tests.slurm.nodes import gres_nodes

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1200)]  # generous: the cluster is shared and busy
SCRIPT = REPO / "tests" / "scripts" / "emulator_reach.py"


def gone(pids: list[int]) -> bool:
    """Whether none of ``pids`` is a cs_emulator any more (the job's own; other jobs' may run meanwhile),
    looked at until a deadline that only a server left running reaches."""
    def alive() -> list[int]:
        left = []
        for pid in pids:
            try:
                if b"csrun.cli.cs_emulator" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    left.append(pid)
            except OSError:
                pass
        return left

    deadline = time.monotonic() + 60
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    return not alive()


@pytest.mark.parametrize("exit_code", [0, 3])
def test_emulator_runs_beside_the_chief_and_stops_whatever_the_exit(slurm_env: dict[str, str], tmp_path: Path, exit_code: int) -> None:
    done = subprocess.run([str(BIN / "csrun_wse"), "--emulator", "--total-nodes", "2", "--tasks-per-node", "1", str(BIN / "python-pt"), str(SCRIPT), str(tmp_path), str(exit_code)], env={**slurm_env, "CS_IP": "10.9.9.9:9000"}, capture_output=True, text=True, timeout=900)
    assert (done.returncode == 0) == (exit_code == 0), done.stderr
    records = {int(p.stem.split("_")[1]): json.loads(p.read_text()) for p in tmp_path.glob("rank_*.json")}
    chief = records[0]
    assert chief["connected"] and chief["cs_ip"].startswith("127.0.0.1:") and chief["node"] in gres_nodes(slurm_env)
    assert chief["has_token"] and records[1]["has_token"]
    assert records[1]["cs_ip"] is None, "the job's own emulator replaces any CS_IP from outside"
    assert "emulator for this job at 127.0.0.1:" in done.stderr
    assert len(chief["emulator_pids"]) == 1 and gone(chief["emulator_pids"])  # the job's emulator, stopped
