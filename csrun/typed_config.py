"""The one configuration mechanism: typed, keyword-only dataclasses read from YAML, env or flags.

Every setting csrun reads — the site config (:mod:`csrun.site`), launcher options
(:mod:`csrun.launch.options`), the params YAML (:mod:`csrun.run.params`) and the input sections
(:mod:`csrun.data.config`) — is a field of a keyword-only dataclass declared with
:func:`setting` (or :func:`required`): a default, a doc, and the field's valid range, declared
once (``min``, ``max``, ``above``, ``below``, ``finite``; a ``pattern`` with the words ``what`` it
stands for). Whatever a field declares, NaN is refused, a float stays within float32's range and
a whole number within 64 bits: no value read from a user reaches torch, numpy or Slurm as a
number they cannot hold. Three readers share one set of rules:

* :func:`from_mapping` builds a dataclass from a YAML mapping: every key must be a field (an
  unknown key names its path, suggests the closest key and lists the valid ones with their
  defaults and docs), every value must fit the field's annotation (``int``, ``float``,
  ``bool``, ``str``, ``X | None``, ``A | B``, ``list[X]``, ``tuple[X, ...]``,
  ``dict[str, Any]``, ``Literal[...]``, ``Any`` and nested dataclasses) and its bounds, and
  fields without a default are required;
* :func:`from_text` reads one field's value from a string (an environment variable or a
  command-line word): ``True``/``yes``/``1``/``on`` and ``False``/``no``/``0``/``off`` for
  booleans, comma-separated lists, ``""``/``none`` for ``None``;
* :func:`check_fields` checks an instance built in code (or changed by overrides) by the
  same rules.

Every problem is a :class:`~csrun.errors.ConfigError` (exit 2) whose message starts with the
path of the bad value (``runconfig.max_steps``, ``--total-nodes``, ``CSRUN_DEF_NODES``) and names
the value and what would be right. Rules that tie several fields together stay in the config
class's own ``check`` method and raise the same error.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from typing import Any, Literal, Mapping, TypeVar, Union, get_args, get_origin

from csrun.errors import ConfigError

__all__ = ["FLOAT_LIMIT", "INT_LIMITS", "ConfigError", "bool_word", "check_fields", "field_doc", "from_mapping",
           "from_text", "required", "setting", "valid_keys", "valid_range"]

T = TypeVar("T")
_MISSING = dataclasses.MISSING
_TRUE = frozenset({"true", "yes", "1", "on"})
_FALSE = frozenset({"false", "no", "0", "off"})
_NONE = frozenset({"", "none", "null"})


FLOAT_LIMIT = 3.4028234663852886e38
"""The largest finite number a setting takes (float32's: what the device computes in)."""
INT_LIMITS = (-(2**63), 2**63 - 1)
"""The least and the greatest whole number a setting takes (a 64-bit integer's: torch's, numpy's, Slurm's)."""


def setting(default: Any, doc: str, *, min: int | float | None = None, max: int | float | None = None,
            above: float | None = None, below: float | None = None, finite: bool = True,
            pattern: str | None = None, what: str = "", **metadata: Any) -> Any:
    """A config field: its default, its meaning, and its valid range, declared once.

    ``min`` / ``max``: the least / greatest value a number may take; ``above`` / ``below``: a
    number it must exceed / stay under (``above=0``: positive; a dropout rate: ``below=1``).
    ``finite=False``: infinity is a value (a timeout that never expires), whatever ``max``
    says of finite ones; by default it is refused. Whatever the bounds, NaN is refused, a float's size stays within float32's
    (:data:`FLOAT_LIMIT`) and a whole number's within 64 bits (:data:`INT_LIMITS`).
    ``pattern``: a regular expression a non-empty string must match in full; ``what`` says in
    words what it stands for (used in the error). A list or dict default is copied for every
    instance. Extra ``metadata`` is kept for the field's reader (e.g. the launcher's ``flag``).
    """
    meta = _bounds(doc, min=min, max=max, above=above, below=below, finite=finite, pattern=pattern, what=what)
    meta.update(metadata)
    if isinstance(default, (list, dict)):
        fresh: Any = default
        return dataclasses.field(default_factory=lambda: type(fresh)(fresh), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def required(doc: str, *, min: int | float | None = None, max: int | float | None = None, above: float | None = None,
             below: float | None = None, finite: bool = True, pattern: str | None = None, what: str = "") -> Any:
    """A config field the input must give (no default); its bounds as :func:`setting`'s."""
    return dataclasses.field(metadata=_bounds(doc, min=min, max=max, above=above, below=below, finite=finite,
                                              pattern=pattern, what=what))


def _bounds(doc: str, **bounds: Any) -> dict[str, Any]:
    return {"doc": doc, **bounds}


def valid_range(f: dataclasses.Field) -> str:
    """The field's declared range in words (``at least 0 and less than 1``), or ``""`` when it has none."""
    parts = []
    if f.metadata.get("min") is not None:
        parts.append(f"at least {f.metadata['min']}")
    if f.metadata.get("above") is not None:
        parts.append(f"greater than {f.metadata['above']:g}")
    if f.metadata.get("max") is not None:
        parts.append(f"at most {f.metadata['max']}")
    if f.metadata.get("below") is not None:
        parts.append(f"less than {f.metadata['below']:g}")
    return " and ".join(parts) + (", or inf" if parts and f.metadata.get("finite") is False else "")


def field_doc(f: dataclasses.Field) -> str:
    """The field's ``doc`` metadata, or ``""``."""
    return str(f.metadata.get("doc", ""))


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not _MISSING:
        return f.default
    if f.default_factory is not _MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return _MISSING


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """``cls``'s resolved field types, resolved once (resolving them was most of a read's time)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _init_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]


def valid_keys(cls: type) -> str:
    """The keys of ``cls`` with their defaults ("required" when none) and docs, one per line."""
    lines = []
    for f in _init_fields(cls).values():
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


def _convert(value: Any, tp: Any, path: str, text: bool) -> Any:
    """``value`` as type ``tp`` (``text``: ``value`` is a string to parse), or ConfigError naming ``path``."""
    if tp is Any:
        return value
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        for option in options:
            try:
                return _convert(value, option, path, text)
            except ConfigError:
                continue
        real = [o for o in options if o is not type(None)]
        if len(real) == 1:  # X | None: say what X needs
            _convert(value, real[0], path, text)
        raise ConfigError(f"{path}: {value!r} is not {_type_name(tp)}")
    if tp is type(None):
        if value is None or (text and str(value).strip().lower() in _NONE):
            return None
        raise ConfigError(f"{path}: {value!r} is not null")
    if origin is Literal:
        choices = get_args(tp)
        if isinstance(value, str):
            for c in choices:
                if isinstance(c, str) and c.lower() == value.strip().lower():
                    return c
        if value in choices and not isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: {value!r} is not one of {', '.join(repr(c) for c in choices)}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            check_fields(value, path)
            return value
        if text or not isinstance(value, Mapping):
            raise ConfigError(f"{path}: {value!r} must be a mapping.\n{valid_keys(tp)}")
        return from_mapping(tp, value, path)
    if origin in (list, tuple):
        if text:
            value = [p.strip() for p in str(value).split(",") if p.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: {value!r} must be {_type_name(tp)}")
        inner = get_args(tp)[0]
        items = [_convert(v, inner, f"{path}[{i}]", text) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if text or not isinstance(value, Mapping):
            raise ConfigError(f"{path}: {value!r} must be a mapping")
        return dict(value)
    if text:
        return _parse_text(str(value), tp, path)
    return _check_plain(value, tp, path)


def bool_word(raw: str) -> bool | None:
    """True or False for the usual spellings of a yes/no setting (``1``/``0``, ``true``/``false``,
    ``yes``/``no``, ``on``/``off``; any case, spaces around), None for anything else."""
    word = raw.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    return None


def _parse_text(raw: str, tp: Any, path: str) -> Any:
    word = raw.strip()
    if tp is bool:
        value = bool_word(raw)
        if value is None:
            raise ConfigError(f"{path}: {raw!r} is not yes or no (1/0, true/false, yes/no, on/off)")
        return value
    if tp is int:
        try:
            return int(word)
        except ValueError:
            raise ConfigError(f"{path}: {raw!r} is not a whole number") from None
    if tp is float:
        try:
            return float(word)
        except ValueError:
            raise ConfigError(f"{path}: {raw!r} is not a number") from None
    if tp is str:
        return raw
    raise ConfigError(f"{path}: cannot read a value of type {_type_name(tp)} from text")


def _check_plain(value: Any, tp: Any, path: str) -> Any:
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
            try:
                return float(value)
            except OverflowError:  # an integer beyond any float
                raise _beyond_float32(path, value, "") from None
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


def _check_bounds(value: Any, f: dataclasses.Field, path: str, shown: Any) -> None:
    """The field's range and ``pattern`` rules; ``shown`` is the value as the user wrote it.
    A number out of range names the bound it broke, and the whole range when it has two sides."""
    pattern = f.metadata.get("pattern")
    if pattern and isinstance(value, str) and value and not re.fullmatch(pattern, value):
        what = f.metadata.get("what") or f"a match of {pattern!r}"
        raise ConfigError(f"{path}: {shown!r} is not {what}")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    if value != value:
        raise ConfigError(f"{path}: {shown!r} is not a number")
    whole = valid_range(f)
    if isinstance(value, float) and math.isinf(value) and f.metadata.get("finite", True):
        raise ConfigError(f"{path}: {shown!r} must be a finite number" + (f" (valid: {whole})" if whole else ""))
    both = f" (valid: {whole})" if " and " in whole else ""
    for key, broken, words in (("min", lambda b: value < b, "at least"), ("above", lambda b: not value > b, "greater than"),
                               ("max", lambda b: value > b, "at most"), ("below", lambda b: not value < b, "less than")):
        bound = f.metadata.get(key)
        if key in ("max", "below") and value == math.inf:  # allowed above (finite=False): no limit, not a big one
            continue
        if bound is not None and broken(bound):
            shown_bound = bound if key in ("min", "max") else f"{bound:g}"
            raise ConfigError(f"{path}: {shown!r} must be {words} {shown_bound}{both}")
    if isinstance(value, float) and not math.isinf(value) and abs(value) > FLOAT_LIMIT:
        raise _beyond_float32(path, shown, whole)
    elif isinstance(value, int) and not INT_LIMITS[0] <= value <= INT_LIMITS[1]:
        raise ConfigError(f"{path}: {shown!r} is out of range: a whole number here fits in 64 bits "
                          f"({INT_LIMITS[0]} to {INT_LIMITS[1]})")


def _beyond_float32(path: str, shown: Any, whole: str) -> ConfigError:
    return ConfigError(f"{path}: {shown!r} is out of range: a setting's numbers stay within float32's "
                       f"+-{FLOAT_LIMIT:.3g}" + (f" ({whole})" if whole else ""))


def _read(value: Any, f: dataclasses.Field, tp: Any, path: str, text: bool) -> Any:
    converted = _convert(value, tp, path, text)
    _check_bounds(converted, f, path, value)
    return converted


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def from_mapping(cls: type[T], data: Mapping[str, Any], path: str, *, source: str = "") -> T:
    """Build dataclass ``cls`` from ``data``.

    ``path`` is the YAML path of ``data`` (e.g. ``runconfig``; ``""`` for a whole file);
    ``source`` (e.g. the file's name) starts every message when given.
    """
    try:
        return _from_mapping(cls, data, path)
    except ConfigError as exc:
        if not source:
            raise
        raise ConfigError(f"{source}: {exc.what}", fix=exc.fix or None, location=exc.location) from None


def _from_mapping(cls: type[T], data: Mapping[str, Any], path: str) -> T:
    if not isinstance(data, Mapping):
        where = f"{path}: " if path else ""
        raise ConfigError(f"{where}must be a mapping of keys to values, got {data!r}.\n{valid_keys(cls)}")
    hints = _hints(cls)
    fields = _init_fields(cls)
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{_join(path, str(key))}: unknown key.{hint}\n{valid_keys(cls)}")
        values[key] = _read(value, fields[key], hints[key], _join(path, key), text=False)
    for name, f in fields.items():
        if name not in values and _default_of(f) is _MISSING:
            raise ConfigError(f"{_join(path, name)}: required key missing ({field_doc(f) or _type_name(hints[name])})")
    return cls(**values)


def from_text(cls: type, name: str, raw: str, path: str) -> Any:
    """Field ``name`` of ``cls`` read from the string ``raw`` (an env variable, a flag's value).

    ``path`` names where ``raw`` came from in errors (``CSRUN_DEF_NODES``, ``--total-nodes``).
    """
    fields = _init_fields(cls)
    if name not in fields:
        raise ConfigError(f"{path}: unknown key {name!r}.\n{valid_keys(cls)}")
    return _read(raw, fields[name], _hints(cls)[name], path, text=True)


def check_fields(obj: Any, path: str) -> None:
    """Check every field of the dataclass instance ``obj`` by its type and bounds (ConfigError under ``path``)."""
    hints = _hints(type(obj))
    for name, f in _init_fields(type(obj)).items():
        _read(getattr(obj, name), f, hints[name], _join(path, name), text=False)
