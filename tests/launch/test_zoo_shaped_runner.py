"""A runner shaped like the R1.6 zoo's, under csrun_cpu and csrun_wse --legacy-imports: the CPU
stub is never taken; on three tasks the zoo's own DistributedSampler shards are streamed as they
are (every sample once per epoch, ``max_steps`` reached, one chief training); compile_only and
validate_only compile through ``cbtorch.compile`` and exit 0; the compile records the scaler's
loss scaling and clipping."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BIN

SCRIPT = Path(__file__).parents[1] / "torch" / "scripts" / "zoo_shaped_runner.py"
pytestmark = pytest.mark.timeout(240)


def launch(env: dict[str, str], launcher: list[str], out: Path, *flags: str) -> dict:
    done = subprocess.run([*launcher, sys.executable, str(SCRIPT), str(out), "24", *flags], env=env,
                          capture_output=True, text=True, timeout=200, cwd=out.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_three_tasks_stream_the_zoos_own_shards_once_each(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    model_dir = tmp_path / "wse"
    got = launch(no_slurm_env, [str(BIN / "csrun_wse"), "--legacy-imports", "--total-nodes", "3"],
                 tmp_path / "wse.json", "--cs_ip", "embedded", "--model_dir", str(model_dir))
    assert got["steps"] == 24 and len(got["losses"]) == 24 and got["tasks"] == 3
    assert got["batches_per_epoch"] == 96 // 8  # the chief's len() agrees with what arrives
    seen = got["seen"]
    for epoch in range(2):  # 12 batches an epoch: every sample exactly once in each
        assert sorted(seen[epoch * 96:(epoch + 1) * 96]) == list(range(96))
    [spec] = model_dir.glob("cs_*/spec.json")
    recorded = json.loads(spec.read_text())
    assert recorded["loss_scaling"]["factor"] == "dynamic" and recorded["max_gradient_norm"] == 1.0
    assert (model_dir / "checkpoint_24.mdl").is_file()


def test_a_lone_chief_trains_and_compile_only_and_validate_only_compile_through_cbtorch_compile(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    cpu = [str(BIN / "csrun_cpu"), "--legacy-imports"]
    device = launch(no_slurm_env, cpu, tmp_path / "device.json", "--cs_ip", "embedded",
                    "--model_dir", str(tmp_path / "device"))
    assert device["steps"] == 24 and sorted(device["seen"][:96]) == list(range(96))
    for flag in ("--compile_only", "--validate_only"):
        got = launch(no_slurm_env, cpu, tmp_path / f"{flag[2:]}.json", flag, "--model_dir", str(tmp_path / flag[2:]))
        assert got["steps"] == 0
    assert list((tmp_path / "compile_only").glob("cs_*/spec.json")) and \
        not list((tmp_path / "validate_only").glob("cs_*/spec.json"))


def test_a_compile_only_run_on_three_tasks_compiles_on_the_chief(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    """The zoo's compile runner opens no Session: the chief compiles from its own shard, and each
    streamer, with nothing to stream, exits 0."""
    wse = [str(BIN / "csrun_wse"), "--legacy-imports", "--total-nodes", "3"]
    done = subprocess.run([*wse, sys.executable, str(SCRIPT), str(tmp_path / "c.json"), "24", "--compile_only",
                           "--model_dir", str(tmp_path / "compile")], env=no_slurm_env, capture_output=True, text=True,
                          timeout=200, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads((tmp_path / "c.json").read_text())["steps"] == 0
    assert list((tmp_path / "compile").glob("cs_*/spec.json"))
    assert "csrun: streaming from" not in done.stdout + done.stderr  # the streamers served nothing
