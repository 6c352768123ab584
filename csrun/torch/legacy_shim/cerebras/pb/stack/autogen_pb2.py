"""Legacy import shim: ``cerebras.pb.stack.autogen_pb2``: the autogen policy values a script assigns
to ``cbtorch.state().full_config`` (recorded there; csrun's compile does not read them)."""

AP_DISABLED = 0
"""The "autogen disabled" policy."""
