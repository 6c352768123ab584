"""``cerebras.framework.torch.core.modes``: the run modes, as the strings the command line uses."""

from __future__ import annotations

TRAIN = "train"
"""Training."""
EVAL = "eval"
"""Evaluation."""
TRAIN_AND_EVAL = "train_and_eval"
"""Training, then evaluation."""
INFERENCE = "inference"
"""Forward only, no labels."""


def get_modes() -> list[str]:
    """Every mode."""
    return [TRAIN, EVAL, TRAIN_AND_EVAL, INFERENCE]


def is_valid(mode: str) -> bool:
    """Whether ``mode`` is one of :func:`get_modes`."""
    return mode in get_modes()
