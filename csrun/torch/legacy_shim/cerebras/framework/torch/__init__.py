"""Legacy import shim: ``cerebras.framework.torch`` is :mod:`csrun.torch`, with R1.6's own
``initialize``, ``compile``, ``env``, ``optimizer`` and namespaces (:mod:`csrun.torch.r1.framework`)."""

import csrun.torch as _csrun_torch
from csrun.torch import *  # noqa: F401,F403
from csrun.torch.r1.framework import compile, data, env, initialize, nn, optim, optimizer, utils  # type: ignore[assignment]  # noqa: F401,E501

import cerebras.framework.torch.amp as amp  # type: ignore[no-redef]  # noqa: E402,F401  (R1.6 amp)
import cerebras.framework.torch.core as core  # noqa: E402,F401


def __getattr__(name: str):  # noqa: ANN202 - module-level forwarding of everything else
    return getattr(_csrun_torch, name)
