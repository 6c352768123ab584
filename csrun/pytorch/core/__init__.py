"""``cstorch.core``: :mod:`modes` (the run modes)."""

from csrun.pytorch.core import modes

__all__ = ["modes"]
