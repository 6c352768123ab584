"""The slides' 2.x scripts under ``csrun_wse --total-nodes 3`` on the local Slurm cluster: the
executor's input runs on the two streamer tasks (the existing streaming and its input table), the
chief trains on the embedded emulator (or the job's cs_emulator with ``--emulator``), and the
losses equal eager torch over the streamed order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import csrun.pytorch as cstorch
from csrun.site import load_site_config
from tests.conftest import BIN
from tests.pytorch.conftest import SLIDE_SKELETON, SLIDE_TRAIN, eager_skeleton, eager_slide_train, read_losses, run

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1200)]  # generous: the cluster is shared and busy

WSE = [str(BIN / "csrun_wse"), "--total-nodes", "3", "--tasks-per-node", "1", str(BIN / "python-pt")]


def streamed_by_two(stdout: str) -> None:
    """Two streamers, each on a node of its own off the GRES node (which two is Slurm's choice)."""
    assert "csrun: streaming from 2 streamer(s)" in stdout
    nodes = dict(re.findall(r"streamer (\d+) │ (\S+)", stdout))
    assert sorted(nodes) == ["1", "2"] and nodes["1"] != nodes["2"], stdout[-3000:]
    assert load_site_config({}).gres_node not in nodes.values()


def test_slide_train_streams_from_two_workers(slurm_env: dict[str, str], tmp_path: Path) -> None:
    done = run([*WSE, str(SLIDE_TRAIN), "CSX", str(tmp_path / "losses.txt")], tmp_path,
               SLURM_CONF=slurm_env["SLURM_CONF"])
    streamed_by_two(done.stdout)
    assert "Compile for training completed successfully!" in done.stdout
    losses, eager = read_losses(tmp_path / "losses.txt"), eager_slide_train(streamers=2)
    assert len(losses) == len(eager) == 30
    assert max(abs(a - b) for a, b in zip(losses, eager)) <= 1e-6


def test_skeleton_streams_to_the_jobs_cs_emulator_and_checkpoints(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """csrun_wse --emulator: a cs_emulator for the job, CS_IP exported: "CSX" trains through it over TCP."""
    out = tmp_path / "out"
    done = run([WSE[0], "--emulator", *WSE[1:], str(SLIDE_SKELETON), "CSX", str(out), "0"], tmp_path,
               SLURM_CONF=slurm_env["SLURM_CONF"])
    assert "csrun_wse: emulator for this job at 127.0.0.1:" in done.stderr
    streamed_by_two(done.stdout)
    eager, _ = eager_skeleton(100, streamers=2)
    losses = read_losses(out / "losses.txt")
    assert len(losses) == 1000 and max(abs(a - b) for a, b in zip(losses[:100], eager)) <= 1e-6
    assert sorted(p.name for p in out.glob("*.mdl")) == sorted(f"checkpoint_{i}.mdl" for i in range(99, 1000, 100))
    assert cstorch.load(out / "checkpoint_999.mdl")["global_step"] == 999
