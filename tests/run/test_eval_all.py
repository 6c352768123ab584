"""--mode eval_all: every checkpoint in model_dir, one TensorBoard point each at its global step,
the losses eval gives for each checkpoint alone; on the CPU and on the embedded emulator."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import yaml

from tests.run.conftest import DEBUG_YAML, scalars

Run = Callable[..., int]


def three_checkpoints(fc_mnist: Run, md: Path) -> None:
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu",
                    "--max_steps", "150", "--checkpoint_steps", "50") == 0
    assert sorted(p.name for p in md.glob("*.mdl")) == ["checkpoint_100.mdl", "checkpoint_150.mdl", "checkpoint_50.mdl"]


def eval_alone(fc_mnist: Run, tmp_path: Path, md: Path, step: int, *flags: str) -> tuple[float, float]:
    alone = tmp_path / f"alone_{step}"
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "eval", "-o", str(alone), "--checkpoint_path",
                    str(md / f"checkpoint_{step}.mdl"), *flags) == 0
    return scalars(alone / "eval", "loss")[0][1], scalars(alone / "eval", "accuracy")[0][1]


def test_eval_all_on_the_cpu_gives_one_point_per_checkpoint(fc_mnist: Run, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "md"
    three_checkpoints(fc_mnist, md)
    capsys.readouterr()
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "eval_all", "-o", str(md), "--cpu") == 0
    out = capsys.readouterr().out
    assert out.count("Avg Eval. Loss = ") == 3 and "Evaluation Completed Successfully!" in out
    loss, accuracy = scalars(md / "eval", "loss"), scalars(md / "eval", "accuracy")
    assert [s for s, _ in loss] == [50, 100, 150] and [s for s, _ in accuracy] == [50, 100, 150]
    for (step, value), (_, acc) in zip(loss, accuracy):
        assert (value, acc) == eval_alone(fc_mnist, tmp_path, md, step, "--cpu")
    assert len({v for _, v in loss}) == 3  # three different weights were scored
    assert yaml.safe_load((md / "eval" / "params_eval_all.yaml").read_text())["runconfig"]["mode"] == "eval_all"


def test_eval_all_on_the_embedded_emulator_compiles_once(fc_mnist: Run, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """One eval program, each checkpoint's weights loaded into it; --eval_steps: every checkpoint
    scores the same first batches (the rest of each pass's epoch runs unread)."""
    md = tmp_path / "md"
    three_checkpoints(fc_mnist, md)
    capsys.readouterr()
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "eval_all", "-o", str(md), "--cs_ip", "embedded",
                    "--eval_steps", "2") == 0
    out = capsys.readouterr().out
    assert out.count("Compile for evaluation completed successfully!") == 1
    assert out.count("Scored 128 eval samples (2 batches) at global step ") == 3
    loss = scalars(md / "eval", "loss")
    assert [s for s, _ in loss] == [50, 100, 150]
    for step, value in loss:
        alone, _ = eval_alone(fc_mnist, tmp_path, md, step, "--cs_ip", "embedded", "--eval_steps", "2")
        assert value == pytest.approx(alone, rel=1e-6, abs=1e-7)
        cpu, _ = eval_alone(fc_mnist, tmp_path / "cpu", md, step, "--cpu", "--eval_steps", "2")
        assert value == pytest.approx(cpu, rel=1e-5, abs=1e-6)


def test_eval_all_skips_a_corrupt_checkpoint_and_needs_one(fc_mnist: Run, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "md"
    three_checkpoints(fc_mnist, md)
    bad = md / "checkpoint_100.mdl"
    bad.write_bytes(bad.read_bytes()[:1000])
    capsys.readouterr()
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "eval_all", "-o", str(md), "--cpu") == 0
    out = capsys.readouterr().out
    assert f"checkpoint {bad} is corrupt or truncated" in out and "skipped 1 that did not verify" in out
    assert [s for s, _ in scalars(md / "eval", "loss")] == [50, 150]
    empty = tmp_path / "empty"
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "eval_all", "-o", str(empty), "--cpu") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--mode eval_all: no checkpoint in" in err and "Traceback" not in err


MPIEXEC = Path(__import__("sys").executable).parent / "mpiexec"


@pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec in the venv")
def test_eval_all_with_two_streamers_on_the_embedded_emulator(fc_mnist: Run, tmp_path: Path) -> None:
    """One streamed session for every checkpoint (only one Session per run can stream); with
    --eval_steps each pass still scores the epoch's first batches: the last checkpoint's point is
    what eval gives for it alone with the same streamers."""
    import os
    import subprocess
    import sys

    from tests.run.conftest import FC_MNIST

    md = tmp_path / "md"
    three_checkpoints(fc_mnist, md)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "CS_IP", "CSRUN_LAUNCHER")}

    def streamed(out: Path, mode: str, *flags: str) -> str:
        done = subprocess.run([str(MPIEXEC), "-n", "3", sys.executable, str(FC_MNIST / "run.py"), "-p",
                               str(DEBUG_YAML), "-m", mode, "-o", str(out), "--cs_ip", "embedded", "--eval_steps", "3",
                               *flags], env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=200)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "streaming from 2 streamer(s)" in done.stdout
        return done.stdout

    out = streamed(md, "eval_all")
    assert out.count("Scored 192 eval samples (3 batches) at global step ") == 3
    points = scalars(md / "eval", "loss")
    assert [s for s, _ in points] == [50, 100, 150]
    streamed(tmp_path / "alone", "eval", "--checkpoint_path", str(md / "checkpoint_150.mdl"))
    assert points[-1][1] == pytest.approx(scalars(tmp_path / "alone" / "eval", "loss")[0][1], rel=1e-6, abs=1e-7)
