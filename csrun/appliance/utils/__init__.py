"""``cerebras.appliance.utils``: :mod:`file` and :mod:`units`."""
