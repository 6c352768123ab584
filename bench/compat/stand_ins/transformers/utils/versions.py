"""Stand-in: ``transformers.utils.versions.importlib_metadata`` is the standard library's."""

import importlib.metadata as importlib_metadata  # noqa: F401
