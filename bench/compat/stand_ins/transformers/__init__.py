"""A stand-in for the one name the R1.6 zoo's ``huggingface_common`` takes from Hugging Face
transformers at import (``transformers.utils.versions.importlib_metadata``); the zoo's pinned
transformers (4.18, with tokenizers < 0.13) has no wheel for Python 3.11."""
