"""Legacy import shim: ``cerebras.workflow.python``."""
