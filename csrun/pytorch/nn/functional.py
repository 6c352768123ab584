"""``cstorch.nn.functional``: ``one_hot`` (torch's, as the system's kernel computes it)."""

from __future__ import annotations

import torch


def one_hot(tensor: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    """``torch.nn.functional.one_hot``."""
    return torch.nn.functional.one_hot(tensor, num_classes)


__all__ = ["one_hot"]
