"""Typed, keyword-only dataclasses from YAML mappings, with errors that name the YAML path.

:func:`from_mapping` builds a dataclass from a mapping: every key must be a field (an unknown
key lists the valid ones with their defaults), every value must fit the field's annotation
(``int``, ``float``, ``bool``, ``str``, ``X | None``, ``A | B``, ``list[X]``, ``tuple[X, ...]``,
``dict[str, Any]``, ``Literal[...]``, ``Any`` and nested dataclasses), and fields without a
default are required. Field docs come from ``field(metadata={"doc": ...})``.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, Mapping, TypeVar, Union, get_args, get_origin

from csrun.errors import UserError


class ConfigError(UserError):
    """A config key or value that does not fit; the message names its YAML path."""


T = TypeVar("T")
_MISSING = dataclasses.MISSING


def field_doc(f: dataclasses.Field) -> str:
    """The field's ``doc`` metadata, or ``""``."""
    return str(f.metadata.get("doc", ""))


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not _MISSING:
        return f.default
    if f.default_factory is not _MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return _MISSING


def valid_keys(cls: type) -> str:
    """The keys of ``cls`` with their defaults ("required" when none), one per line."""
    lines = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        default = _default_of(f)
        shown = "required" if default is _MISSING else f"default {default!r}"
        doc = field_doc(f)
        lines.append(f"  {f.name} ({shown})" + (f": {doc}" if doc else ""))
    return "valid keys:\n" + "\n".join(lines)


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if get_origin(tp) is Literal:
        return " or ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    origin = get_origin(tp)
    if origin in (list, tuple):
        return f"a list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, path: str) -> Any:
    """``value`` as type ``tp``, or ConfigError naming ``path``."""
    if tp is Any:
        return value
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        for option in get_args(tp):
            try:
                return _convert(value, option, path)
            except ConfigError:
                continue
        raise ConfigError(f"{path}: {value!r} is not {_type_name(tp)}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{path}: {value!r} is not null")
    if origin is Literal:
        choices = get_args(tp)
        if isinstance(value, str):
            for c in choices:
                if isinstance(c, str) and c.lower() == value.lower():
                    return c
        if value in choices and not isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: {value!r} is not one of {', '.join(repr(c) for c in choices)}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: {value!r} must be a mapping.\n{valid_keys(tp)}")
        return from_mapping(tp, value, path)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: {value!r} must be {_type_name(tp)}")
        inner = get_args(tp)[0]
        items = [_convert(v, inner, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: {value!r} must be a mapping")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: {value!r} must be true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{path}: {value!r} must be a whole number")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-4 as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{path}: {value!r} must be a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{path}: {value!r} must be a string")
    raise ConfigError(f"{path}: cannot read a value of type {_type_name(tp)}")


def from_mapping(cls: type[T], data: Mapping[str, Any], path: str) -> T:
    """Build dataclass ``cls`` from ``data``; ``path`` is the YAML path of ``data`` (e.g. ``runconfig``)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{path}.{key}: unknown key.{hint}\n{valid_keys(cls)}")
        values[key] = _convert(value, hints[key], f"{path}.{key}")
    for name, f in fields.items():
        if name not in values and _default_of(f) is _MISSING:
            raise ConfigError(f"{path}.{name}: required key missing ({field_doc(f) or _type_name(hints[name])})")
    return cls(**values)
