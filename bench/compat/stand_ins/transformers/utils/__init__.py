"""Stand-in: ``transformers.utils``."""
