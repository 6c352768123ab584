"""``torch_xla.utils.utils``: the one name R1.x scripts took from the torch_xla the system shipped."""

from __future__ import annotations

from typing import Any, Iterator


class SampleGenerator:
    """Yields the same ``data`` ``sample_count`` times (fake input of a fixed shape; ``len()`` is the count)."""

    def __init__(self, data: Any, sample_count: int) -> None:
        self._data = data
        self._count = int(sample_count)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self._count):
            yield self._data
