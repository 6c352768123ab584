"""One job at a time in a model_dir (csrun.run.model_dir_lock): a second run stops in one line
and touches nothing; a lock left by a killed run is taken over. A crash leaves nothing a later run
keeps: the next run removes half-written temporaries, and ``losses.csv`` has every row added."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from csrun.run.model_dir_lock import LOCK_NAME, ModelDirBusy, model_dir_lock
from csrun.run.summaries import LossLog
from tests.run.conftest import DEBUG_YAML

Run = Callable[..., int]


def test_a_second_run_in_a_busy_model_dir_stops_in_one_line_and_touches_nothing(
        fc_mnist: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "md"
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu", "--max_steps", "20") == 0
    before = {p.name: p.read_bytes() for p in md.rglob("*") if p.is_file()}
    capsys.readouterr()
    with model_dir_lock(md):  # another job holds it
        assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu", "--resume") == 1
    err = capsys.readouterr().err
    assert f"model_dir {md} is in use by job" in err and "pid " in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in md.rglob("*") if p.is_file()} == before
    assert not (md / LOCK_NAME).exists()  # released with its holder


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path: Path) -> None:
    """kill -9 of the holder: the kernel drops its flock, so the next run takes the model_dir."""
    md = tmp_path / "md"
    md.mkdir()
    code = ("import sys, time; from pathlib import Path; from csrun.run.model_dir_lock import model_dir_lock\n"
            "with model_dir_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(md)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ModelDirBusy, match=f"pid {holder.pid} on "):
            with model_dir_lock(md):
                pass
    finally:
        holder.kill()
        holder.wait()
    assert (md / LOCK_NAME).exists()  # left behind by the killed holder
    with model_dir_lock(md):
        assert json.loads((md / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_a_save_cut_short_leaves_nothing_the_next_run_keeps(fc_mnist: Run, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    md = tmp_path / "md"
    (md / "losses").mkdir(parents=True)
    stale = [md / ".checkpoint_100.mdl.4242.tmp", md / ".checkpoint_100.mdl.sha256.4242.tmp",
             md / "losses" / ".losses.csv.4242.tmp"]
    for path in stale:
        path.write_bytes(b"half a file")
    (md / "notes.tmp").write_text("the user's own file")
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu", "--max_steps", "20") == 0
    assert not any(path.exists() for path in stale) and (md / "notes.tmp").exists()
    assert sum("left by a run that stopped while writing it" in r.message for r in caplog.records) == 3


def test_every_loss_row_is_in_the_file_as_soon_as_it_is_added(tmp_path: Path) -> None:
    """A crash loses at most the step being taken: nothing waits in a buffer."""
    log = LossLog(tmp_path, start_step=0)
    log.add(1, 0.5)
    log.add(2, 0.25)
    assert (tmp_path / "losses" / "losses.csv").read_text() == "step,loss\n1,0.5\n2,0.25\n"
    log.close()
