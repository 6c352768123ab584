"""``cstorch.core.modes``: the run modes, as the strings the command line uses (R1.x's, plus ``eval_all``)."""

from __future__ import annotations

from csrun.torch.r1.modes import EVAL, INFERENCE, TRAIN, TRAIN_AND_EVAL

EVAL_ALL = "eval_all"
"""Evaluate every checkpoint in the model directory."""


def get_modes() -> list[str]:
    """Every mode."""
    return [TRAIN, EVAL, EVAL_ALL, TRAIN_AND_EVAL, INFERENCE]


def is_valid(mode: str) -> bool:
    """Whether ``mode`` is one of :func:`get_modes`."""
    return mode in get_modes()


__all__ = ["TRAIN", "EVAL", "EVAL_ALL", "TRAIN_AND_EVAL", "INFERENCE", "get_modes", "is_valid"]
