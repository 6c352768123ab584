"""Legacy import shim: ``cerebras.framework.torch.core`` (``cb_model``, ``modes``, ``name_scope``, ``appliance``)."""

from csrun.torch.r1.framework import appliance, name_scope  # noqa: F401

import cerebras.framework.torch.core.cb_model as cb_model  # noqa: E402,F401
import cerebras.framework.torch.core.modes as modes  # noqa: E402,F401
