"""A miniature 2.2.1 Model Zoo package (tests only)."""
