"""Legacy import shim: ``cerebras.workflow``."""
