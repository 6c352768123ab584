"""``cstorch.utils``: :class:`CSConfig` (:mod:`csrun.pytorch.utils.config`) and :mod:`data`
(``DataLoader``, ``DataExecutor``: :mod:`csrun.pytorch.utils.data`)."""

from __future__ import annotations

from csrun.pytorch.utils import data
from csrun.pytorch.utils.config import CSConfig, CSConfigError

__all__ = ["CSConfig", "CSConfigError", "data"]
