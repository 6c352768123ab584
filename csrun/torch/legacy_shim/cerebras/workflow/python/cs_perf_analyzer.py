"""Legacy import shim: ``cerebras.workflow.python.cs_perf_analyzer`` is :mod:`csrun.torch.r1.perf`."""

import sys

import csrun.torch.r1.perf as _perf

sys.modules[__name__] = _perf
