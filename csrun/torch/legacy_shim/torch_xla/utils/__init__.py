"""Legacy import shim: ``torch_xla.utils``."""
