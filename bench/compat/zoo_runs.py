"""What both releases' compatibility tables share: running one command and reading its losses,
comparing two runs, the synthetic MNIST files, the table (:mod:`modelzoo`, :mod:`modelzoo2`)."""

from __future__ import annotations

import re
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
STAND_INS = Path(__file__).resolve().parent / "stand_ins"
BIN = ROOT / "bin"


@dataclass
class Result:
    """One command's outcome."""

    name: str
    command: str
    rc: int
    steps: int | None
    losses: list[float]
    average_eval_loss: float | None


def write_idx(path: Path, array: np.ndarray) -> None:
    """An unsigned-byte IDX file, as MNIST's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack(">HBB", 0, 8, array.ndim))
        f.write(struct.pack(">" + "I" * array.ndim, *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def make_mnist(data: Path, samples: int) -> None:
    """Random digits and labels in both MNIST file sets, under ``data/{train,val}/MNIST/raw``."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        raw = data / split / "MNIST" / "raw"
        for prefix in ("train", "t10k"):
            write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (samples, 28, 28)))
            write_idx(raw / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, (samples,)))


def run(name: str, argv: list[str], zoo: Path, env: dict[str, str], *, step: re.Pattern[str],
        avg_eval: re.Pattern[str], metric: re.Pattern[str] | None = None) -> Result:
    """Run ``argv`` in ``zoo`` (its root, or a model's folder) and read the losses it logged (``step``:
    the step line's pattern, groups 2 and 3 the step and loss; ``metric``: eval metrics, named in the row)."""
    done = subprocess.run(argv, cwd=zoo, env=env, capture_output=True, text=True, timeout=900)
    text = done.stdout + done.stderr
    steps = [(int(m.group(2)), float(m.group(3))) for m in step.finditer(text)]
    avg = avg_eval.search(text)
    if done.returncode != 0:
        sys.stderr.write(f"--- {name} exited {done.returncode}:\n{text[-3000:]}\n")
    metrics = ", ".join(f"{k}={float(v):.6g}" for k, v in metric.findall(text)) if metric else ""
    shown = " ".join(a if a.startswith("-") or "/" not in a else Path(a).name for a in argv)
    return Result(name=name + (f" ({metrics})" if metrics else ""), command=shown, rc=done.returncode,
                  steps=steps[-1][0] if steps else None, losses=[loss for _, loss in steps],
                  average_eval_loss=float(avg.group(1)) if avg else None)


def same(a: Result, b: Result) -> str:
    """Whether two runs logged the same losses (to 1e-5)."""
    if not a.losses or len(a.losses) != len(b.losses):
        return "-"
    if all(abs(x - y) <= 1e-5 + 1e-9 for x, y in zip(a.losses, b.losses)):  # logged to 5 decimals
        return "yes"
    sys.stderr.write(f"--- {a.name} differs from {b.name}:\n{a.losses}\n{b.losses}\n")
    return "no"


def print_table(title: str, table: list[tuple[Result, Result | None]]) -> int:
    """The markdown table (``title``: the first column's heading); 0 when every command exited 0."""
    print(f"| {title} | command | exit | last step | last loss | losses = the reference's (1e-5) |")
    print("|---|---|---|---|---|---|")
    for r, ref in table:
        equal = "-" if ref is None else same(r, ref)
        if ref is not None and r.average_eval_loss is not None and ref.average_eval_loss is not None:
            equal += f" (avg eval loss {r.average_eval_loss:.6f} vs {ref.average_eval_loss:.6f})"
        last = f"{r.losses[-1]:.5f}" if r.losses else "-"
        print(f"| {r.name} | `{r.command}` | {r.rc} | {r.steps if r.steps is not None else '-'} | {last} | {equal} |")
    return 0 if all(r.rc == 0 for r, _ in table) else 1
