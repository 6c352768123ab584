"""Shared test helpers: line numbers computed from source, default settings, a quiet console,
the torch LR schedulers the schedule tests cover."""

from __future__ import annotations

import inspect
import io
import os
from typing import Any, Callable

import torch
from rich.console import Console
from torch.optim import lr_scheduler as S

from csrun.compiler import CompileSettings

SETTINGS = CompileSettings(mode="train", learning_rate=1e-3)


LR_SCHEDULERS: dict[str, Callable[[torch.optim.Optimizer], Any]] = {
    "StepLR": lambda o: S.StepLR(o, step_size=7, gamma=0.5),
    "MultiStepLR": lambda o: S.MultiStepLR(o, milestones=[5, 12, 12, 30], gamma=0.3),
    "ExponentialLR": lambda o: S.ExponentialLR(o, gamma=0.93),
    "LinearLR": lambda o: S.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=20),
    "ConstantLR": lambda o: S.ConstantLR(o, factor=0.5, total_iters=9),
    "CosineAnnealingLR": lambda o: S.CosineAnnealingLR(o, T_max=15, eta_min=0.001),
    "PolynomialLR": lambda o: S.PolynomialLR(o, total_iters=40, power=2.0),
    "SequentialLR": lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.1, total_iters=10),
                                                 S.CosineAnnealingLR(o, T_max=30)], milestones=[10]),
    "ChainedScheduler": lambda o: S.ChainedScheduler([S.ConstantLR(o, factor=0.5, total_iters=6),
                                                      S.ExponentialLR(o, gamma=0.95)]),
}
"""Each torch LR scheduler the device runs, by name: a maker from the optimizer (compiler and device tests)."""


def line_of(obj: Any, needle: str) -> int:
    """The file line number of the first line of ``obj``'s source containing ``needle``."""
    lines, start = inspect.getsourcelines(obj)
    for i, text in enumerate(lines):
        if needle in text:
            return start + i
    raise AssertionError(f"{needle!r} not in the source of {obj!r}")


def here() -> int:
    """The caller's current line."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


def same_file(a: str | None, b: str) -> bool:
    """Two paths name the same file."""
    return a is not None and os.path.abspath(a) == os.path.abspath(b)


def console() -> tuple[Console, io.StringIO]:
    """A rich console writing to a buffer (wide, no colour)."""
    buf = io.StringIO()
    return Console(file=buf, width=200, color_system=None), buf
