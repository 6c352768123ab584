"""``cstorch.utils``: :class:`CSConfig` (:mod:`~csrun.pytorch.utils.config`), :mod:`data` (the loop),
:mod:`tensorboard`, :mod:`tracker`, :mod:`nest`, :mod:`kernel`."""

from __future__ import annotations

from csrun.pytorch.utils import data, kernel, nest, tensorboard, tracker
from csrun.pytorch.utils.config import CSConfig, CSConfigError

__all__ = ["CSConfig", "CSConfigError", "data", "kernel", "nest", "tensorboard", "tracker"]
