"""Legacy import shim: ``torch_xla.utils.utils`` is :mod:`csrun.torch.r1.xla` (``SampleGenerator``)."""

import sys

import csrun.torch.r1.xla as _xla

sys.modules[__name__] = _xla
