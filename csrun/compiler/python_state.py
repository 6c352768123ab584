"""Python values of a model that its step depends on: watched, so a compiled step never goes stale silently.

The system captured the step once; a ``forward`` that branches on a Python value (``if
self.use_b:``, ``if self.step < 10:``) was compiled with the value it had then. Eager PyTorch
reads the value again at every call, so csrun watches the values a script changes:

* A :class:`PythonStateWatch` per model (the driver's) hears, through a hook on
  ``nn.Module.__setattr__`` installed once per process, the assignments to its modules. A plain
  value (a number, string, bool, None, a tuple/list/dict of them, or a small tensor that is not
  a parameter: the capture bakes it in as a constant) assigned to one of their attributes bumps
  :attr:`PythonStateWatch.version` and is remembered with its line. Parameters, buffers and
  submodules are not such values (buffers and parameters are device state),
  and ``training`` is the module mode, which the driver records per call (an assignment of it
  bumps :attr:`PythonStateWatch.mode_version`, so the modes are read again only then).
* The driver compares, at each model call, the values set since the step was recorded with the
  values they had then (:meth:`PythonStateWatch.guards` / :meth:`PythonStateWatch.changed_since`):
  a changed value recompiles the step, with one notice naming the line that changed it.
* A ``forward`` that changes such a value itself (a Python counter, ``self.step += 1``) would
  change it at every call in eager PyTorch, but on the device its Python runs only when the step
  is compiled: :func:`in_forward` collects the assignments to a model's modules that change a
  value while the step is captured (torch.export's run, which follows the recording's), and
  :func:`forward_changes` reports them as :class:`ForwardChangesPythonState`, located at the
  assignment.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import types
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from csrun.compiler.errors import CompileError, Location, at
from csrun.compiler.locate import caller_location

_MISSING: Any = object()
_SKIP = frozenset({"training"})
"""Attributes that are not Python values of the step (the module mode is recorded per call)."""


class ForwardChangesPythonState(CompileError):
    """The model's forward changes a Python attribute each call (a counter): the device would freeze it."""

    fix = ("on the device the forward's Python runs once, when the step is compiled, so the value would stop "
           "changing; keep it as a tensor the step updates (self.register_buffer('step', torch.zeros((), "
           "dtype=torch.long)); self.step += 1; torch.where(self.step < n, a, b)) or pass it in with the batch")


@dataclass(frozen=True)
class Change:
    """A Python value assigned to a watched module's attribute."""

    module: torch.nn.Module
    name: str
    old: Any
    new: Any
    location: Location | None

    def describe(self, path: str) -> str:
        """``path.name changed (old -> new)`` for messages."""
        return f"{path}{'.' if path else ''}{self.name} changed ({self.old!r} -> {self.new!r})"


SMALL_TENSOR = 4096
"""A plain tensor attribute up to this many elements is a value of the step (a temperature, a
mask): the capture bakes it into the program as a constant, so a new one recompiles."""


def _namespace(value: Any) -> bool:
    """A simple record of values: a ``SimpleNamespace`` or a dataclass instance (a config object)."""
    return isinstance(value, types.SimpleNamespace) or (dataclasses.is_dataclass(value) and not isinstance(value, type))


def plain(value: Any) -> bool:
    """Whether ``value`` is plain data a step can depend on: Python data that ``==`` compares
    (containers and simple records of it, a config namespace or dataclass), or a small tensor
    attribute that is not a parameter (the capture's constants)."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, enum.Enum)):
        return True
    if _namespace(value):
        fields = vars(value) if isinstance(value, types.SimpleNamespace) else \
            {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return len(fields) <= 64 and all(plain(v) for v in fields.values())
    if isinstance(value, torch.Tensor):
        return not isinstance(value, torch.nn.Parameter) and value.numel() <= SMALL_TENSOR and not value.is_meta
    if isinstance(value, (tuple, list)):
        return len(value) <= 64 and all(plain(v) for v in value)
    if isinstance(value, dict):
        return len(value) <= 64 and all(plain(k) and plain(v) for k, v in value.items())
    return False


class PythonStateWatch:
    """The Python values assigned to one model's modules (see the module manual)."""

    def __init__(self, model: torch.nn.Module) -> None:
        """Watch ``model``'s modules from now on (installs the process's hook once)."""
        _install()
        self.version = 0
        """Bumped by every assignment of a plain value to one of the model's modules."""
        self.mode_version = 0
        """Bumped by every assignment of a module's ``training`` (``model.train()`` / ``eval()``)."""
        self._first: dict[tuple[int, str], tuple[torch.nn.Module, Any]] = {}
        """(module, name) -> the module and the value before it was first assigned."""
        self._last: dict[tuple[int, str], Change] = {}
        self.structure_version = 0
        """Bumped by every assignment of a submodule, a parameter or a ``forward`` to one of the
        model's modules (the model the step runs is another one: :meth:`structure_changed`)."""
        self.last_structure_change: Change | None = None
        self.adopt(model)

    def adopt(self, model: torch.nn.Module) -> None:
        """Watch every module of ``model`` (the modules added since, after a structure change)."""
        for m in model.modules():
            _OWNERS[m] = self

    def structure_changed(self, module: torch.nn.Module, name: str, value: Any, old: Any) -> None:
        """The hook: ``module.name = value`` replaces a submodule, a parameter or the ``forward``."""
        self.structure_version += 1
        self.version += 1
        self.last_structure_change = Change(module=module, name=name, old=_kind_of(old), new=_kind_of(value),
                                            location=caller_location())

    def assigned(self, module: torch.nn.Module, name: str, value: Any, old: Any) -> None:
        """The hook: ``module.name = value`` (a plain value, replacing ``old``) is about to happen."""
        key = (id(module), name)
        self._first.setdefault(key, (module, old))
        self._last[key] = Change(module=module, name=name, old=None if old is _MISSING else old, new=value,
                                 location=caller_location())
        self.version += 1

    def guards(self) -> dict[tuple[int, str], Any]:
        """The current value of every attribute a script has assigned so far (what the step saw;
        tensors copied, so a later fill in place shows as a change)."""
        return {key: _kept(module.__dict__.get(key[1], None)) for key, (module, _) in self._first.items()}

    def changed_since(self, guards: dict[tuple[int, str], Any]) -> Change | None:
        """The last assignment that made a value differ from ``guards`` (a value assigned only
        since then is compared with the value it had before), or None."""
        for key, (module, before) in self._first.items():
            was = guards.get(key, None if before is _MISSING else before)
            if not _same(module.__dict__.get(key[1], None), was):
                return self._last.get(key)
        return None


_OWNERS: "weakref.WeakKeyDictionary[torch.nn.Module, PythonStateWatch]" = weakref.WeakKeyDictionary()
_CAPTURE = threading.local()


def _hook(module: torch.nn.Module, name: str, value: Any) -> None:
    """Before ``module.name = value``: tell the module's watch, and the capture in progress."""
    if name in _SKIP:
        watch = _OWNERS.get(module)
        if watch is not None:
            watch.mode_version += 1
        return
    if isinstance(value, (torch.nn.Module, torch.nn.Parameter)) or name == "forward":
        watch = _OWNERS.get(module)
        if watch is not None and getattr(_CAPTURE, "capture", None) is None:
            watch.structure_changed(module, name, value, module.__dict__.get(name, _MISSING)
                                    if name == "forward" else getattr(module, name, _MISSING))
        return
    if not plain(value):
        return
    watch = _OWNERS.get(module)
    capture = getattr(_CAPTURE, "capture", None)
    if capture is not None and isinstance(value, torch.Tensor):
        return  # the capture's own tensors (fake ones), not the script's values
    sink = capture[1] if capture is not None and id(module) in capture[0] else None
    if watch is None and sink is None:
        return
    state = module.__dict__
    if name in state.get("_parameters", ()) or name in state.get("_buffers", ()) or name in state.get("_modules", ()):
        return  # device state, or a submodule
    old = state.get(name, _MISSING)
    if old is not _MISSING and not plain(old):
        return
    if watch is not None:
        watch.assigned(module, name, value, old)
    if sink is not None and old is not _MISSING and old is not None and not _same(old, value):
        sink.append(Change(module=module, name=name, old=old, new=value, location=caller_location()))


@contextlib.contextmanager
def in_forward(model: torch.nn.Module) -> Iterator[list[Change]]:
    """Collect the assignments that change a plain value of ``model``'s modules while the block
    runs (the capture)."""
    _install()
    sink: list[Change] = []
    previous = getattr(_CAPTURE, "capture", None)
    _CAPTURE.capture = ({id(m) for m in model.modules()}, sink)
    try:
        yield sink
    finally:
        _CAPTURE.capture = previous


def _kind_of(value: Any) -> str:
    """A short name of what an attribute holds, for the notice of a structure change."""
    if value is _MISSING or value is None:
        return "nothing"
    if isinstance(value, torch.nn.Parameter):
        return f"a parameter {tuple(value.shape)}"
    if isinstance(value, torch.nn.Module):
        return type(value).__name__
    return getattr(value, "__qualname__", type(value).__name__)


def _kept(value: Any) -> Any:
    """A copy of a plain value to compare with later (tensors and containers copied, so a change
    in place shows)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, dict, tuple)) or _namespace(value):
        return copy.deepcopy(value)
    return value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and bool(torch.equal(a.detach().cpu(), b.detach().cpu())))
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - a value without a usable ==: same only if identical
        return a is b


_installed = False


def _install() -> None:
    global _installed
    if _installed:
        return
    original = torch.nn.Module.__setattr__

    def __setattr__(self: torch.nn.Module, name: str, value: Any) -> None:
        _hook(self, name, value)
        original(self, name, value)

    torch.nn.Module.__setattr__ = __setattr__  # type: ignore[method-assign]
    _installed = True


def forward_changes(changes: list[Change], model: torch.nn.Module) -> list[CompileError]:
    """The problems for assignments a forward made while the step was captured (one per line)."""
    paths = {id(m): f"model.{n}" if n else "model" for n, m in model.named_modules()}
    problems: list[CompileError] = []
    seen: set[tuple[str, int] | None] = set()
    for c in changes:
        key = (c.location.filename, c.location.lineno) if c.location else None
        if key in seen:
            continue
        seen.add(key)
        what = c.describe(paths.get(id(c.module), type(c.module).__name__))
        problems.append(ForwardChangesPythonState(
            f"the forward assigns a Python value each call: {what}", location=c.location))
    return problems


def describe_change(change: Change, model: torch.nn.Module | None) -> str:
    """``file:line: model.x changed (a -> b)`` for the recompile notice."""
    path = "model"
    if model is not None:
        for n, m in model.named_modules():
            if m is change.module:
                path = f"model.{n}" if n else "model"
                break
    return f"{at(change.location)}{change.describe(path)}"
