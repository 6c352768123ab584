"""The runner's small parts: progress display, losses.csv on resume, performance.json, threads."""

from __future__ import annotations

import io
import time
from pathlib import Path

import torch

from csrun.run.performance import performance_doc
import pytest

from csrun.errors import ConfigError
from csrun.run.progress import Progress, log_line, wants_bar
from csrun.run.runner import set_threads
from csrun.run.summaries import LossLog, read_losses
from csrun.stream.stats import ChiefStats, StreamerStats, StreamStats


def test_plain_progress_prints_log_lines_only() -> None:
    out = io.StringIO()
    p = Progress(start=0, total=10, stream=out)
    p.step(1, 2.0, 100.0)
    p.log(log_line(5, 10, 1.5, 0.01, 1234.5, elapsed=75.4, eta=3725))
    p.close()  # off a terminal: the time of day first
    stamp, line = out.getvalue()[:20], out.getvalue()[20:]
    assert time.strptime(stamp, "%Y-%m-%d %H:%M:%S ")
    assert line == "| Train: step 5/10, loss 1.5, lr 0.01, 1234.5 samples/s, 0:01:15 elapsed, ETA 1:02:05\n"


def test_terminal_progress_draws_a_bar() -> None:
    out = io.StringIO()
    p = Progress(start=0, total=10, stream=out, bar=True)
    for s in range(1, 11):
        p.step(s, 1.0 / s, 500.0)
    p.log("a line above the bar")
    p.close()
    text = out.getvalue()
    assert "10/10" in text and "a line above the bar" in text and "samples/s" in text


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("env,bar", [
    ({}, True),                                                   # a terminal
    ({"TERM": "dumb"}, False),
    ({"SLURM_STEP_ID": "0"}, False),                              # srun --unbuffered: a tty into a job log
    ({"SLURM_STEP_ID": "0", "SLURM_PTY_PORT": "40211"}, True),   # srun --pty: interactive
    ({"SLURM_STEP_ID": "0", "CSRUN_PROGRESS": "bar"}, True),
    ({"CSRUN_PROGRESS": "lines"}, False),
])
def test_the_bar_is_drawn_only_on_a_real_terminal(env: dict, bar: bool) -> None:
    assert wants_bar(_Tty(), env) is bar
    assert wants_bar(io.StringIO(), {k: v for k, v in env.items() if k != "CSRUN_PROGRESS"}) is False


def test_a_bad_progress_choice_names_it() -> None:
    with pytest.raises(ConfigError, match="^CSRUN_PROGRESS: 'fancy' is not one of 'auto', 'bar', 'lines' \\(the chief's progress display"):
        wants_bar(_Tty(), {"CSRUN_PROGRESS": "fancy"})


def test_loss_log_drops_rows_after_the_resume_step(tmp_path: Path) -> None:
    log = LossLog(tmp_path, 0)
    for s in range(1, 8):
        log.add(s, float(s))
    log.close()
    log = LossLog(tmp_path, 5)  # resumed from checkpoint 5 after running to 7
    log.add(6, 60.0)
    log.close()
    assert read_losses(tmp_path) == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0), (6, 60.0)]


def test_performance_doc_per_ordinal_and_verdict() -> None:
    stats = StreamStats(chief=ChiefStats(batches=10, input_wait_s=3.0, step_s=1.0),
                        streamers=[StreamerStats(rank=1, node="w1", batches=10, bytes=10**6, seconds=2.0)])
    doc = performance_doc(total_samples=640, total_time=4.0, batch_size=64, stats=stats,
                          compile_info={"compile_time": 1.5, "est_samples_per_sec": 9e6}, path="system",
                          mode="train", global_step=10)
    assert doc["samples_per_sec"] == 160.0 and doc["compile_time"] == 1.5 and doc["est_samples_per_sec"] == 9e6
    assert doc["per_ordinal"][0]["ordinal"] == 1 and doc["per_ordinal"][0]["samples_per_sec"] == 320.0
    assert doc["suspected_input_bottleneck"] is True and doc["programming_time"] is None


def test_threads_follow_slurm_cpus_per_task() -> None:
    before = torch.get_num_threads()
    set_threads({"SLURM_CPUS_PER_TASK": "3"})
    assert torch.get_num_threads() == 3
    set_threads({"SLURM_CPUS_PER_TASK": "2", "OMP_NUM_THREADS": "1"})  # the user's setting wins
    assert torch.get_num_threads() == 3
    torch.set_num_threads(before)
