"""Seed 004's command line, only the paths adapted, under csrun_wse on the local Slurm cluster (debug config).

    csrun_wse python-ws run.py -m train -o gpt3_xl_pile -p configs/params_gpt3_xl_pile.yaml --cs_ip $CS_IP --max_steps 2000

becomes ``csrun_wse python-ws models/gpt2/run.py -m train -o gpt3_xl_pile -p configs/gpt3_debug.yaml --cs_ip $CS_IP
--max_steps 2000``, typed into a shell whose ``CS_IP`` names a running cs_emulator (the system).
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from csrun.run.summaries import read_losses
from tests.conftest import BIN, REPO

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(400)]

SEED_004 = ("csrun_wse python-ws models/gpt2/run.py -m train -o {out} -p configs/gpt3_debug.yaml "
            "--cs_ip $CS_IP --max_steps 2000")


def start_emulator(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen([str(BIN / "cs_emulator"), "--listen", "127.0.0.1:0"], env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"listening on (127\.0\.0\.1:\d+)", log.read_text())
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"cs_emulator did not start: {log.read_text()}")


def test_seed_004_command_trains_in_weight_streaming_mode(slurm_env: dict[str, str], tmp_path: Path) -> None:
    env = {**slurm_env, "PATH": f"{BIN}:{slurm_env['PATH']}", "CSRUN_EMULATOR_TOKEN": secrets.token_hex(16),
           "OMP_NUM_THREADS": "1"}
    server, address = start_emulator(env, tmp_path / "emulator.log")
    out = tmp_path / "gpt3_xl_pile"
    try:
        done = subprocess.run(["bash", "-c", SEED_004.format(out=out)], env={**env, "CS_IP": address}, cwd=REPO,
                              capture_output=True, text=True, timeout=360)
    finally:
        server.terminate()
        server.wait(timeout=30)
    log = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 0, log
    assert "Compile for training completed successfully!" in done.stdout, log
    assert "Training Completed Successfully!" in done.stdout + done.stderr, log
    (folder,) = out.glob("cs_*")
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["execution_strategy"] == "weight_streaming" and plan["fits"]  # python-ws selected it
    losses = read_losses(out)
    assert [s for s, _ in losses] == list(range(1, 2001))
    assert sum(l for _, l in losses[-50:]) < sum(l for _, l in losses[:50]) / 2  # the loss falls
    perf = json.loads((out / "performance" / "performance.json").read_text())
    assert perf["path"] == "system"
    assert (out / "checkpoint_2000.mdl").is_file()
