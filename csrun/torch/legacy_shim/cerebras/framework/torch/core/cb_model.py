"""Legacy import shim: ``cerebras.framework.torch.core.cb_model`` is :mod:`csrun.torch.core.cb_model`."""

import sys

import csrun.torch.core.cb_model as _cb_model

sys.modules[__name__] = _cb_model
