"""``cstorch.experimental.listener``: tensor listeners (the system's debugging hooks), not in csrun."""

from __future__ import annotations

from csrun.torch.r1.unsupported import unsupported

create_listener = unsupported(
    "cerebras.pytorch.experimental.listener.create_listener",
    "read a step's values in a cstorch.step_closure instead; remove runconfig.experimental.listeners")

__all__ = ["create_listener"]
