"""Legacy import shim: ``cerebras.pytorch`` is its csrun package itself (:mod:`csrun.module_alias`)."""

from csrun.module_alias import become

become(__name__)
