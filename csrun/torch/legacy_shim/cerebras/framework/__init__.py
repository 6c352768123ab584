"""Legacy import shim (csrun --legacy-imports)."""
