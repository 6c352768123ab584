"""The block a run ends with, and its ``performance/<mode>/summary.json``.

At the end of train and of eval the chief prints one block, as HF Trainer's ``train_runtime``
or torch_xla's ``metrics_report`` do::

    Run summary (train)
      wall time        0:00:04 (4.2 s, from run.py's start)
      steps            0 -> 300 (300 this run)
      final loss       0.0473
      samples/s        71234.5 (21300 samples, input included)
      last checkpoint  model_dir/fc_mnist/checkpoint_300.mdl
      TensorBoard      tensorboard --logdir model_dir/fc_mnist (events in .../train)
      files            model_dir/fc_mnist/performance/train/summary.json

and writes the same figures to ``model_dir/performance/<mode>/summary.json`` (``train``,
``eval``, ``eval_all``), so that an eval never overwrites the training figures.
``performance/performance.json`` stays the legacy file, the last run's. With
``CSRUN_TASK_LOG_DIR`` (``--log-dir``) the block names the task logs' folder too.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from csrun.consoles import clock
from csrun.env_settings import TASK_LOG_DIR
from csrun.files import atomic_write


@dataclass(frozen=True)
class RunSummary:
    """What one mode of a run did (the block's and the file's figures)."""

    mode: str
    wall_time_s: float
    start_step: int
    end_step: int
    samples: int
    samples_per_sec: float
    final_loss: float | None
    last_checkpoint: str | None
    tensorboard_dir: str
    model_dir: str
    log_dir: str | None = None


def summary_path(model_dir: Path, mode: str) -> Path:
    """``model_dir/performance/<mode>/summary.json``."""
    return Path(model_dir) / "performance" / mode / "summary.json"


def make_summary(*, mode: str, started: float, start_step: int, end_step: int, samples: int, total_time: float,
                 final_loss: float | None, last_checkpoint: Path | None, tensorboard_dir: Path,
                 model_dir: Path) -> RunSummary:
    """The summary of a mode that started at ``started`` (``time.monotonic()``) and ends now."""
    log_dir = os.environ.get(TASK_LOG_DIR.name, "") or None
    return RunSummary(mode=mode, wall_time_s=round(time.monotonic() - started, 3), start_step=start_step,
                      end_step=end_step, samples=samples,
                      samples_per_sec=round(samples / total_time, 1) if total_time > 0 else 0.0,
                      final_loss=final_loss, last_checkpoint=str(last_checkpoint) if last_checkpoint else None,
                      tensorboard_dir=str(tensorboard_dir), model_dir=str(model_dir), log_dir=log_dir)


def render(summary: RunSummary) -> list[str]:
    """The block's lines."""
    s = summary
    evaluating = s.mode != "train"
    steps = (f"weights of global step {s.end_step}" if evaluating
             else f"{s.start_step} -> {s.end_step} ({s.end_step - s.start_step} this run)")
    loss = "-" if s.final_loss is None else f"{s.final_loss:.6g}"
    lines = [f"Run summary ({s.mode})",
             f"  wall time        {clock(s.wall_time_s)} ({s.wall_time_s:.1f} s, from run.py's start)",
             f"  steps            {steps}",
             f"  {'eval loss' if evaluating else 'final loss'}       {loss}",
             f"  samples/s        {s.samples_per_sec:.1f} ({s.samples} samples, input included)"]
    if not evaluating:
        lines.append(f"  last checkpoint  {s.last_checkpoint or '-'}")
    lines.append(f"  TensorBoard      tensorboard --logdir {s.model_dir} (events in {s.tensorboard_dir})")
    lines.append(f"  files            {summary_path(Path(s.model_dir), s.mode)}")
    if s.log_dir:
        lines.append(f"  task logs        {s.log_dir}")
    return lines


def write_summary(summary: RunSummary) -> Path:
    """Write ``performance/<mode>/summary.json`` atomically; its path."""
    path = summary_path(Path(summary.model_dir), summary.mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, json.dumps(asdict(summary), indent=2) + "\n")
