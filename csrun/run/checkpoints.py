"""Checkpoints in model_dir: ``checkpoint_<step>.mdl`` plus ``checkpoint_<step>.mdl.sha256``.

A checkpoint is a ``.mdl`` file (:mod:`csrun.mdl`: the one writer, atomic with its sha256
sidecar, and the one verifying reader, weights-only) holding a dict of plain data. Keys
written by the runner:

``model``          the model's state dict
``optimizer``      the optimizer's state dict
``lr_scheduler``   ``{"global_step": N}`` (the schedule is a pure function of the global step)
``amp``            loss-scaling state (empty on the CPU path)
``global_step``    optimizer steps taken
``data_position``  global batch index the next step starts at (``loader.skip`` on resume;
                   :func:`csrun.run.loops.next_step_start`)

A crash mid-save leaves at most a ``.tmp`` file, which is never counted as a checkpoint (the
next run, holding the model_dir's lock, removes it); the previous checkpoint stays valid. Here: the names, the newest valid one for ``--resume``, and
pruning to ``keep_checkpoint_max``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from csrun.mdl import SUFFIX_SHA, CheckpointError, read_mdl, write_mdl

CHECKPOINT_RE = re.compile(r"^checkpoint_(\d+)\.mdl$")
"""Names counted as checkpoints."""

__all__ = ["CHECKPOINT_RE", "CheckpointError", "Found", "checkpoint_path", "latest_valid", "list_checkpoints",
           "load_checkpoint", "prune_checkpoints", "save_checkpoint", "set_aside_earlier_run"]

EARLIER_RUN_FOLDERS = ("losses", "train", "eval", "performance", ".csrun_idle_preemptions")
"""What a run writes beside its checkpoints (the compile folders ``cs_<hash>`` stay: they are reusable;
the last: :data:`csrun.run.preemption.IDLE_FILE`, the run's count of fruitless preemptions)."""


def checkpoint_path(model_dir: Path, step: int) -> Path:
    """``model_dir/checkpoint_<step>.mdl``."""
    return Path(model_dir) / f"checkpoint_{step}.mdl"


def save_checkpoint(model_dir: Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically as ``checkpoint_<step>.mdl`` with its checksum; return the path
    (a failed write is :func:`csrun.mdl.write_mdl`'s one-line error; earlier checkpoints stay)."""
    folder = Path(model_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return write_mdl(checkpoint_path(folder, step), state)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The state dict in checkpoint ``path`` (verified, weights-only: :func:`csrun.mdl.read_mdl`)."""
    state = read_mdl(path)
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"checkpoint {path}: not a csrun checkpoint (no 'model' entry)")
    return state


@dataclass(frozen=True)
class Found:
    """A checkpoint picked for ``--resume``."""

    path: Path
    step: int
    state: dict[str, Any]
    skipped: tuple[str, ...] = ()
    """One line per newer checkpoint that could not be used, and why."""


def list_checkpoints(model_dir: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``checkpoint_<step>.mdl`` in ``model_dir``, newest first."""
    folder = Path(model_dir)
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = CHECKPOINT_RE.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(1)), p))
    return sorted(found, reverse=True)


def latest_valid(model_dir: Path) -> Found | None:
    """The newest checkpoint in ``model_dir`` that verifies and loads; None when there is none."""
    skipped: list[str] = []
    for step, path in list_checkpoints(model_dir):
        try:
            state = load_checkpoint(path)
        except CheckpointError as exc:
            skipped.append(str(exc))
            continue
        return Found(path=path, step=step, state=state, skipped=tuple(skipped))
    if skipped:
        raise CheckpointError(f"no valid checkpoint in {model_dir} (give --checkpoint_path PATH): " + "; ".join(skipped))
    return None


def prune_checkpoints(model_dir: Path, keep: int, *, protect: tuple[int, ...] = ()) -> list[int]:
    """Delete all but the newest ``keep`` checkpoints (with their ``.sha256``) of ``model_dir``;
    steps in ``protect`` (the one a run resumed from) are never deleted. ``keep`` 0 keeps all.
    Returns the steps deleted."""
    if keep <= 0:
        return []
    deleted = []
    for step, path in list_checkpoints(model_dir)[keep:]:
        if step in protect:
            continue
        for target in (path, path.with_name(path.name + SUFFIX_SHA)):
            target.unlink(missing_ok=True)
        deleted.append(step)
    return deleted


def set_aside_earlier_run(model_dir: Path) -> Path:
    """Move an earlier run's checkpoints (with their sha256 files) and :data:`EARLIER_RUN_FOLDERS`
    into ``model_dir/previous_run_<YYYYmmdd-HHMMSS>/`` (renames within model_dir; nothing is
    deleted); returns that folder (``--start_over``)."""
    import time

    model_dir = Path(model_dir)
    target = model_dir / time.strftime("previous_run_%Y%m%d-%H%M%S")
    suffix = 1
    while target.exists():
        target = target.with_name(f"{target.name.split('.')[0]}.{suffix}")
        suffix += 1
    target.mkdir()
    moving = [p for p in model_dir.iterdir() if CHECKPOINT_RE.match(p.name) or
              (p.name.endswith(SUFFIX_SHA) and CHECKPOINT_RE.match(p.name[:-len(SUFFIX_SHA)]))]
    moving += [model_dir / name for name in EARLIER_RUN_FOLDERS if (model_dir / name).exists()]
    for path in moving:
        path.rename(target / path.name)
    return target
