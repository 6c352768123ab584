"""What the chief writes beside the checkpoints: TensorBoard events, params copies, losses.

* ``model_dir/train/`` and ``model_dir/eval/``: TensorBoard event files
  (``torch.utils.tensorboard.SummaryWriter``) and ``params_<mode>.yaml`` (the params as run,
  flags applied). Train scalars, by global step: ``loss``, ``learning_rate``,
  ``samples_per_sec`` (at log steps) and ``loss_scale`` (device path, when the device
  reports it). Eval scalars at the checkpoint's global step: ``loss`` and every metric of
  ``eval_metrics``.
* ``model_dir/losses/losses.csv`` (``runconfig.save_losses``): header ``step,loss``, then one
  row per global step, each in the file as soon as its loss is known (a crash loses at most
  the step being taken). A resumed run first drops the rows after its starting step, so the
  file always holds one row per step of the training history.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from csrun.files import atomic_write


def write_params(folder: Path, mode: str, params: dict[str, Any]) -> Path:
    """``folder/params_<mode>.yaml``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"params_{mode}.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


class Scalars:
    """A TensorBoard writer for one folder (``train/`` or ``eval/``), created on first use."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._writer: Any = None

    def add(self, tag: str, value: float, step: int) -> None:
        """Record ``tag = value`` at ``step``."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.folder.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(log_dir=str(self.folder))
        self._writer.add_scalar(tag, value, step)

    def flush(self) -> None:
        """Write what is buffered."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class LossLog:
    """``losses/losses.csv``: one ``step,loss`` row per global step."""

    HEADER = "step,loss\n"

    def __init__(self, model_dir: Path, start_step: int) -> None:
        self.path = model_dir / "losses" / "losses.csv"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [self.HEADER]
        if self.path.exists():
            for line in self.path.read_text().splitlines(keepends=True)[1:]:
                head = line.split(",", 1)[0]
                if head.isdigit() and int(head) <= start_step and line.endswith("\n"):
                    kept.append(line)
        atomic_write(self.path, "".join(kept), durable=False)  # a crash here keeps the old rows or the new
        self._f = open(self.path, "a", encoding="ascii", buffering=1)  # line-buffered: each row reaches the file

    def add(self, step: int, loss: float) -> None:
        """Append one row (in the file at once: a crash loses at most the step being taken)."""
        self._f.write(f"{step},{loss!r}\n")

    def flush(self) -> None:
        """Push the rows to the file."""
        self._f.flush()

    def close(self) -> None:
        """Flush and close."""
        self._f.close()


def read_losses(model_dir: Path) -> list[tuple[int, float]]:
    """The rows of ``losses/losses.csv`` (for tests and tools)."""
    rows = []
    for line in (Path(model_dir) / "losses" / "losses.csv").read_text().splitlines()[1:]:
        step, loss = line.split(",")
        rows.append((int(step), float(loss)))
    return rows
