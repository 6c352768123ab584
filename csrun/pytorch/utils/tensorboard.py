"""``cstorch.utils.tensorboard.SummaryWriter``: torch's TensorBoard writer, with ``base_step``.

``SummaryWriter(log_dir=..., base_step=N)`` writes real event files as torch's does. A
:class:`~csrun.pytorch.utils.data.DataExecutor` given it as ``writer=`` records the script's
``cstorch.summarize_scalar`` / ``summarize_tensor`` values through it, at ``base_step`` plus
the executor's step (a resumed run passes its starting global step + 1 so its summaries
continue the curve).
"""

from __future__ import annotations

from typing import Any

from torch.utils.tensorboard import SummaryWriter as _TorchSummaryWriter


class SummaryWriter(_TorchSummaryWriter):
    """torch's ``SummaryWriter`` with the step the executor's first step is written at."""

    def __init__(self, *args: Any, base_step: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.base_step = int(base_step)
        """The step the executor's first step's summaries are written at."""


__all__ = ["SummaryWriter"]
