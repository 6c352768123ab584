"""``cstorch.nn``: :mod:`functional` (``one_hot``)."""

from csrun.pytorch.nn import functional

__all__ = ["functional"]
