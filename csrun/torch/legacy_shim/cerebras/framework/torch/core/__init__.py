"""Legacy import shim: ``cerebras.framework.torch.core`` (csrun --legacy-imports)."""
