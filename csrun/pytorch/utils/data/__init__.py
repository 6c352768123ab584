"""``cstorch.utils.data``: the input function, the executor that runs the loop, and step counts.

:class:`DataLoader` / :class:`DataExecutor` / :data:`MbsSetting` are in :mod:`.data_executor`
(its manual is the loop's); :func:`compute_num_steps` in :mod:`.num_steps`;
:class:`SyntheticDataset` in :mod:`.synthetic`.
"""

from __future__ import annotations

from csrun.pytorch.utils.data import data_executor
from csrun.pytorch.utils.data.data_executor import (
    DataExecutor,
    DataLoader,
    ExecutorError,
    MbsSetting,
    current_executor,
)
from csrun.pytorch.utils.data.num_steps import compute_num_steps
from csrun.pytorch.utils.data.synthetic import SyntheticDataset

__all__ = ["DataLoader", "DataExecutor", "ExecutorError", "MbsSetting", "current_executor", "compute_num_steps",
           "SyntheticDataset", "data_executor"]
