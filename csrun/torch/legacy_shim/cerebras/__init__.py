"""Legacy import shim (csrun --legacy-imports): the ``cerebras`` namespace maps onto csrun."""
