"""A stand-in for the one nltk name the R1.6 zoo imports at start-up (``ngrams``, for its ROUGE
metric); the zoo's check puts this folder on the path instead of installing nltk."""

from __future__ import annotations

from typing import Any, Iterable, Iterator


def ngrams(sequence: Iterable[Any], n: int) -> Iterator[tuple[Any, ...]]:
    """Consecutive ``n``-tuples of ``sequence``."""
    items = list(sequence)
    return (tuple(items[i:i + n]) for i in range(len(items) - n + 1))
