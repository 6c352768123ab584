"""``save_losses``: the loss rows are read in groups (one step closure per group, not per step),
every row is written in order, and a NaN loss still stops the run within its group with no
checkpoint of the bad step. Both paths: eager CPU (closures inline) and the embedded emulator
(closures wait for the device)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import pytest

from csrun.run import loops
from csrun.run.summaries import read_losses
from tests.run.conftest import diverging_yaml, write_yaml

Run = Callable[..., int]
PATHS = [pytest.param([], id="cpu"), pytest.param(["--cs_ip", "embedded"], id="embedded")]


def count_closures(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the step of every closure the train loop adds (its second argument)."""
    steps: list[int] = []
    real = loops.cbtorch.add_step_closure

    def counting(fn: Callable[..., Any], args: tuple = (), **kw: Any) -> None:
        if getattr(fn, "__name__", "") == "on_step":
            steps.append(int(args[1]))
        real(fn, args=args, **kw)

    monkeypatch.setattr(loops.cbtorch, "add_step_closure", counting)
    return steps


def last_step_run(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record every step the loop finished (the loop asks ``wants`` after each)."""
    steps: list[int] = []
    wants = loops._StepBook.wants

    def recording(self: loops._StepBook, step: int, unread: int) -> bool:
        steps.append(step)
        return wants(self, step, unread)

    monkeypatch.setattr(loops._StepBook, "wants", recording)
    return steps


@pytest.mark.parametrize("extra", PATHS)
def test_losses_are_read_once_a_group_and_every_row_is_written(fc_mnist: Run, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch, extra: list[str]) -> None:
    p = write_yaml(tmp_path / "p.yaml", max_steps=95, log_steps=25, checkpoint_steps=0, save_losses=True)
    closures = count_closures(monkeypatch)
    assert fc_mnist("-p", str(p), "-m", "train", "-o", str(tmp_path / "md"), *extra) == 0
    rows = read_losses(tmp_path / "md")
    assert [s for s, _ in rows] == list(range(1, 96))
    assert all(math.isfinite(v) for _, v in rows)
    # step 1 is read (the outputs' size decides the grouping), then a group closes after
    # LOSS_READ_EVERY unread rows, or earlier at a log step (25, 50, 75) or the last (95)
    assert closures == [1, 11, 21, 25, 35, 45, 50, 60, 70, 75, 85, 95]
    assert loops.LOSS_READ_EVERY == 10


@pytest.mark.parametrize("extra", PATHS)
def test_large_outputs_are_read_every_step(fc_mnist: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           extra: list[str]) -> None:
    """A group keeps its steps' outputs alive: outputs over the limit are read step by step."""
    monkeypatch.setattr(loops, "LOSS_GROUP_MAX_OUTPUT_BYTES", 8)  # fc_mnist hands back three scalars: 12+ bytes
    p = write_yaml(tmp_path / "p.yaml", max_steps=30, log_steps=25, checkpoint_steps=0, save_losses=True)
    closures = count_closures(monkeypatch)
    assert fc_mnist("-p", str(p), "-m", "train", "-o", str(tmp_path / "md"), *extra) == 0
    assert closures == list(range(1, 31))
    assert [s for s, _ in read_losses(tmp_path / "md")] == list(range(1, 31))


@pytest.mark.parametrize("checkpoint_steps", [0, 7])
@pytest.mark.parametrize("extra", PATHS)
def test_a_nan_loss_stops_the_run_within_its_group(fc_mnist: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str], extra: list[str],
                                                   checkpoint_steps: int) -> None:
    p = diverging_yaml(tmp_path / "nan.yaml", checkpoint_steps=checkpoint_steps, log_steps=1000, save_losses=True)
    ran, closures = last_step_run(monkeypatch), count_closures(monkeypatch)
    md = tmp_path / "md"
    assert fc_mnist("-p", str(p), "-m", "train", "-o", str(md), *extra) == 1
    err = capsys.readouterr().err
    assert "error: NaN loss detected.\n" in err or "error: inf loss detected.\n" in err
    assert "Traceback" not in err
    rows = read_losses(md)
    bad = len(rows) + 1  # the first step whose loss is not finite: its row and later ones are not written
    assert [s for s, _ in rows] == list(range(1, bad)) and all(math.isfinite(v) for _, v in rows)
    # the run stopped at the closure that read the bad loss: the end of its group (10 rows, or a checkpoint step)
    assert max(ran) == min(c for c in closures if c >= bad) < bad + loops.LOSS_READ_EVERY
    saved = sorted(int(c.stem.split("_")[1]) for c in md.glob("checkpoint_*.mdl"))
    assert all(step < bad for step in saved)  # no checkpoint of the bad step or after it
    if checkpoint_steps:
        assert saved == [s for s in range(checkpoint_steps, bad, checkpoint_steps)]
