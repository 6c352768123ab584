"""``cstorch.experimental``: the system's experimental features; the names import, using one raises a line."""

from __future__ import annotations

from csrun.pytorch.experimental import listener
from csrun.torch.r1.unsupported import unsupported

run_implicit_autoregressive_loop = unsupported(
    "cerebras.pytorch.experimental.run_implicit_autoregressive_loop",
    "csrun's device runs training and eval steps; generate with the model on the CPU")

__all__ = ["listener", "run_implicit_autoregressive_loop"]
