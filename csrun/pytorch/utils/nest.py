"""``cstorch.utils.nest``: walking nested batches (dicts, lists, tuples of tensors).

:func:`visit_structure` yields ``(scope, leaf)`` for every leaf ``select_fn`` accepts, the scope
being the keys and indices on the way down (after the ``scope`` given); :func:`visit_torch_tensors`
is it for tensors; :func:`recurse_spec` yields the scopes of a structure's leaves.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch


def visit_structure(data_structure: Any, select_fn: Callable[[Any], bool], strict: bool = False,
                    scope: list[Any] | None = None) -> Iterator[tuple[list[Any], Any]]:
    """``(scope, leaf)`` for every leaf of the structure that ``select_fn`` accepts; ``strict``:
    a leaf it refuses raises ``TypeError``."""
    scope = list(scope or [])
    if isinstance(data_structure, dict):
        for key, value in data_structure.items():
            yield from visit_structure(value, select_fn, strict, scope + [key])
    elif isinstance(data_structure, (list, tuple)):
        for i, value in enumerate(data_structure):
            yield from visit_structure(value, select_fn, strict, scope + [i])
    elif select_fn(data_structure):
        yield scope, data_structure
    elif strict:
        raise TypeError(f"unexpected leaf of type {type(data_structure).__name__} at {scope}")


def visit_torch_tensors(data_structure: Any, scope: list[Any] | None = None) -> Iterator[tuple[list[Any], Any]]:
    """``(scope, tensor)`` for every tensor in the structure."""
    yield from visit_structure(data_structure, lambda x: isinstance(x, torch.Tensor), scope=scope)


def recurse_spec(spec: Any, scope: list[Any] | None = None) -> Iterator[list[Any]]:
    """The scope of every leaf of ``spec``."""
    for path, _ in visit_structure(spec, lambda _: True, scope=scope):
        yield path


__all__ = ["visit_structure", "visit_torch_tensors", "recurse_spec"]
