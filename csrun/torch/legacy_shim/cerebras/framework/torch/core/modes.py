"""Legacy import shim: ``cerebras.framework.torch.core.modes`` is :mod:`csrun.torch.r1.modes`."""

import sys

import csrun.torch.r1.modes as _modes

sys.modules[__name__] = _modes
