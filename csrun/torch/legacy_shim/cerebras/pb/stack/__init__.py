"""Legacy import shim: ``cerebras.pb.stack``."""
