"""Legacy import shim: ``cerebras.framework.torch`` is :mod:`csrun.torch` (csrun --legacy-imports)."""

import csrun.torch as _csrun_torch
from csrun.torch import *  # noqa: F401,F403


def __getattr__(name: str):  # noqa: ANN202 - module-level forwarding of everything else
    return getattr(_csrun_torch, name)
