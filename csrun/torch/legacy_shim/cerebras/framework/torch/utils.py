"""Legacy import shim: ``cerebras.framework.torch.utils`` (``extract_loss``, ``data``, ``nest``) is
``csrun.torch.r1.framework.utils``."""

from csrun.torch.r1.framework import utils as _utils

extract_loss = _utils.extract_loss
data = _utils.data
nest = _utils.nest
