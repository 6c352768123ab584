"""Legacy import shim: ``cerebras.framework.torch.amp`` is :mod:`csrun.torch.r1.amp`."""

import sys

import csrun.torch.r1.amp as _amp

sys.modules[__name__] = _amp
