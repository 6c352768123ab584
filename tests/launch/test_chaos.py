"""Chaos: kill a task of a running csrun_wse job at a random step, four times (the chief twice, each streamer once).

The job is the fc_mnist debug model (float32, so a resumed run is bit-exact) under
``csrun_wse --total-nodes 3`` in local mode (mpiexec: a chief and two streamers), checkpointing
every 20 steps. Each round SIGKILLs one task (the chief twice, whose model_dir a kill could
corrupt, and each streamer once; in an order and at steps a seeded RNG chooses) once the chief has logged that step; the whole job must end within 10 s of the kill, with a
non-zero exit code. Then ``--resume`` runs the job to its end (the plain command when the kill came
before the first checkpoint), and its final weights must equal an uninterrupted run's bit for bit.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import BIN, REPO

pytestmark = pytest.mark.timeout(600)

VICTIMS = [0, 0, 1, 2]
"""The chief twice and each streamer once: the two streamers are alike, a killed chief is the one that could
leave a half-written checkpoint (six rounds, each rank twice, cost the suite ~40 s more; ten random ones
~80 s more and could leave a rank out)."""
STEPS = 80
END_WITHIN_S = 10.0


def params(tmp_path: Path) -> Path:
    doc = yaml.safe_load((REPO / "configs" / "fc_mnist_debug.yaml").read_text())
    doc["runconfig"].update(max_steps=STEPS, checkpoint_steps=20, log_steps=10, save_losses=False)
    path = tmp_path / "chaos.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def command(params_file: Path, model_dir: Path, *extra: str) -> list[str]:
    return [str(BIN / "csrun_wse"), "--total-nodes", "3", str(BIN / "python-pt"), str(REPO / "models" / "fc_mnist" / "run.py"),
            "--mode", "train", "--params", str(params_file), "-o", str(model_dir), *extra]


def task_pids(mark: int) -> dict[int, int]:
    """rank -> pid of the job's tasks: processes with PMI_RANK and ``CSRUN_CHAOS_JOB=mark`` in their environment."""
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ranks = [e.split(b"=", 1)[1] for e in env if e.startswith(b"PMI_RANK=")]
        if not ranks or b"CSRUN_CHAOS_JOB=" + str(mark).encode() not in env:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if "python" in stat.split(")")[0] and b"run.py" in cmdline and b"csrun.launch.task" not in cmdline:
            found[int(ranks[0])] = int(entry.name)  # the task itself, not csrun's wrapper around it
    return found


def final_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    last = max(model_dir.glob("checkpoint_*.mdl"), key=lambda p: int(p.stem.split("_")[1]))
    assert last.name == f"checkpoint_{STEPS}.mdl", last
    return torch.load(last, weights_only=True)["model"]


def test_kill_a_random_task_at_a_random_step_then_resume(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    p = params(tmp_path)
    env = {**no_slurm_env, "OMP_NUM_THREADS": "1"}
    ref = tmp_path / "reference"
    done = subprocess.run(command(p, ref), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    expected = final_weights(ref)
    rng = random.Random(20261123)
    victims = list(VICTIMS)
    rng.shuffle(victims)
    for i, victim in enumerate(victims):
        md = tmp_path / f"chaos_{i}"
        at_step = rng.choice(range(10, STEPS - 10, 10))
        proc = subprocess.Popen(command(p, md), env={**env, "CSRUN_CHAOS_JOB": str(i)}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        killed_at = None
        output: list[str] = []
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                output.append(line)
                if killed_at is None and f"| Train: step {at_step}/" in line:
                    pids = task_pids(i)
                    assert victim in pids, f"round {i}: no task of rank {victim} among {pids}"
                    os.kill(pids[victim], signal.SIGKILL)
                    killed_at = time.monotonic()
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert killed_at is not None, f"round {i}: step {at_step} never logged:\n{''.join(output[-20:])}"
        took = time.monotonic() - killed_at
        print(f"round {i}: rank {victim} killed at step {at_step}: the job ended {took:.2f} s later, exit {proc.returncode}")
        assert took <= END_WITHIN_S, f"round {i}: the job took {took:.1f} s to end after rank {victim} was killed"
        assert proc.returncode != 0, f"round {i}: a job with a killed task exited 0"
        leftovers = task_pids(i)
        assert not leftovers, f"round {i}: tasks left running after the job ended: {leftovers}"
        # --resume continues from the newest checkpoint; killed before the first one, the rerun starts
        # over (--resume with nothing to resume from is refused: it would silently train from step 0)
        again = ("--resume",) if list(md.glob("checkpoint_*.mdl")) else ()
        resumed = subprocess.run(command(p, md, *again), env=env, capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, f"round {i} (rank {victim} killed at step {at_step}): {resumed.stderr[-2000:]}"
        got = final_weights(md)
        assert got.keys() == expected.keys()
        for name in expected:
            assert torch.equal(got[name], expected[name]), f"round {i}: {name} differs after the resume"
