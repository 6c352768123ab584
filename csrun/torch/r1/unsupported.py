"""R1.x names csrun gives no meaning: they import, and using one raises one line saying so."""

from __future__ import annotations

from typing import Any, Callable, NoReturn

from csrun.errors import UserError


class LegacyNameError(UserError):
    """A legacy name was used that csrun does not implement (the message names it and why)."""


def refuse(name: str, why: str) -> NoReturn:
    """Raise :class:`LegacyNameError` for ``name``."""
    raise LegacyNameError(f"csrun does not implement {name}: {why}")


def unsupported(name: str, why: str) -> Callable[..., Any]:
    """A stand-in for the function ``name``: importing it works, calling it raises (see :func:`refuse`)."""

    def call(*args: Any, **kwargs: Any) -> NoReturn:
        refuse(name, why)

    call.__name__ = call.__qualname__ = name.rsplit(".", 1)[-1]
    call.__doc__ = f"Not implemented in csrun: {why}"
    return call


def unsupported_class(name: str, why: str) -> type:
    """A stand-in for the class ``name``: it can be named (annotations, ``isinstance``), not built."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        refuse(name, why)

    return type(name.rsplit(".", 1)[-1], (), {"__init__": __init__, "__doc__": f"Not implemented in csrun: {why}"})
