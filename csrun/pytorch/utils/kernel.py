"""``cstorch.utils.kernel.kernel_annotater``: a hint naming the device kernel an op should use.

On the system ``kernel_annotater("NAME")(torch.matmul)`` marked the op for a hand-written kernel;
the numbers are the op's either way. csrun's device runs the op as written, so the annotater
returns the function unchanged (for ``None`` and for every kernel name).
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def kernel_annotater(kernel_type: str | None = None) -> Callable[[F], F]:
    """A decorator that returns the op it is given (see the module manual)."""

    def annotate(fn: F) -> F:
        return fn

    return annotate


__all__ = ["kernel_annotater"]
