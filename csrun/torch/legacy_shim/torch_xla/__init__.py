"""Legacy import shim: the one ``torch_xla`` module R1.x scripts used (the system shipped torch_xla)."""
