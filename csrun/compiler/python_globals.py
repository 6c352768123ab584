"""Python globals and closure variables a model's forward reads: guarded, so a compiled step never goes stale silently.

A forward may branch on a module-level value (``if USE_B:``, ``scale = CONFIG_SCALE``) or on a
variable of an enclosing function. Eager PyTorch reads it again at every call; the device runs
the step compiled with the value it had. :class:`GlobalReads` watches the forward while its
first call is recorded (``sys.setprofile`` on the recording thread, for that call only) and
notes, for every function of the user's code the forward ran (not torch's, csrun's or the
standard library's), the plain values it can read: the globals its code loads (``LOAD_GLOBAL``)
and its closure variables. Those are the call's :class:`Guard` s:

* the plain attributes of the model's modules their methods read (``self.keep_cols``,
  ``self.cfg``: a list or a config changed in place), beside the assignments
  :mod:`csrun.compiler.python_state` hears;
* at each later call, :func:`changed` compares them with the values now (a few dictionary
  reads); a changed one compiles the step again, with one notice (the driver's recorder does
  this, as for a module attribute the script assigned: :mod:`csrun.compiler.python_state`);
* a replay of the recorded call (the compile's trace, the check against eager) runs with the
  recorded values (:func:`values_set`);
* a forward that changes such a value itself (``global n; n += 1``) is refused: the compile's
  trace replays the call with the recorded values (:func:`values_set`), sees the change and
  reports it at the assignment (:func:`writes_collected`); on the device the forward's Python
  runs once, when the step is compiled, so the value would stop changing.

Plain values are those :func:`csrun.compiler.python_state.plain` accepts (numbers, strings,
bools, None, small containers of them, small tensors); a function, class or module a global
names is not guarded (rebinding one mid-run is not a training pattern).
"""

from __future__ import annotations

import contextlib
import dataclasses
import dis
import functools
import sys
import threading
import types
from dataclasses import dataclass, replace
from typing import Any, Iterator

import torch

from csrun.compiler.errors import CompileError, Location
from csrun.compiler.locate import is_user_file, location_of
from csrun.compiler.python_state import _kept, _same, plain

_MISSING: Any = object()


class ForwardChangesPythonGlobal(CompileError):
    """The forward changes a Python global (or closure variable) each call: the device would freeze it."""

    fix = ("on the device the forward's Python runs once, when the step is compiled, so the value would stop "
           "changing; keep it as a tensor the step updates (a buffer: self.register_buffer('n', torch.zeros((), "
           "dtype=torch.long)); self.n += 1; torch.where(self.n < k, a, b)) or pass it in with the batch")


@dataclass(frozen=True, eq=False)
class Guard:
    """One plain value a recorded call read: a global of a module, or a closure variable."""

    where: Any
    """The module's globals dict, or the closure cell."""
    name: str
    """The global's name (or the variable's)."""
    value: Any
    """Its value when the call was recorded (tensors copied)."""
    owner: str
    """The module (or function) it belongs to, for messages."""
    assigned_at: Location | None = None
    """Where the user's code run by the call assigns it, if it does (``global n; n += 1``)."""
    kind: str = "global"
    """``global``, ``variable`` (of a closure) or ``attribute`` (of a module), for messages."""

    def current(self) -> Any:
        """Its value now (``_MISSING`` when it is gone)."""
        if isinstance(self.where, dict):
            return self.where.get(self.name, _MISSING)
        try:
            return self.where.cell_contents
        except ValueError:
            return _MISSING

    def describe(self) -> str:
        """``module.name`` (a global), ``Class.name`` (an attribute), or ``name (in function)``."""
        return f"{self.name} (in {self.owner})" if self.kind == "variable" else f"{self.owner}.{self.name}"


@functools.lru_cache(maxsize=4096)
def _global_loads(code: types.CodeType) -> tuple[str, ...]:
    """The global names a code object loads."""
    return tuple(sorted({i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"
                         and isinstance(i.argval, str)}))


@functools.lru_cache(maxsize=4096)
def _attribute_loads(code: types.CodeType) -> tuple[str, ...]:
    """The attribute names a code object loads (``self.scale``: ``scale``)."""
    return tuple(sorted({i.argval for i in dis.get_instructions(code)
                         if i.opname in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(i.argval, str)}))


@functools.lru_cache(maxsize=4096)
def _global_stores(code: types.CodeType) -> dict[str, int]:
    """The global names a code object assigns, with the line of the first assignment."""
    out: dict[str, int] = {}
    line = code.co_firstlineno
    for i in dis.get_instructions(code):
        if i.starts_line is not None:
            line = i.starts_line
        if i.opname in ("STORE_GLOBAL", "STORE_DEREF") and isinstance(i.argval, str):
            out.setdefault(i.argval, line)
    return out


class GlobalReads:
    """The plain globals and closure variables of user code run inside the block (see the module manual)."""

    def __init__(self) -> None:
        self._frames: dict[types.CodeType, tuple[dict[str, Any], tuple[Any, ...]]] = {}
        self._modules: dict[int, tuple[torch.nn.Module, set[types.CodeType]]] = {}
        """The modules whose methods ran (``self``), with their code: their attributes the code reads."""

    @contextlib.contextmanager
    def watching(self) -> Iterator["GlobalReads"]:
        """Note the user's functions the block runs (this thread only)."""
        previous = sys.getprofile()
        chained = previous if callable(previous) else None  # a C profiler (cProfile) pauses for the recorded call
        frames = self._frames

        def profile(frame: types.FrameType, event: Any, arg: Any) -> None:
            if event == "call":
                code = frame.f_code
                if is_user_file(code.co_filename):
                    if code not in frames:
                        frames[code] = (frame.f_globals, _cells(frame))
                    owner = frame.f_locals.get("self") if code.co_argcount else None
                    if isinstance(owner, torch.nn.Module):
                        self._modules.setdefault(id(owner), (owner, set()))[1].add(code)
            if chained is not None:
                chained(frame, event, arg)

        sys.setprofile(profile)
        try:
            yield self
        finally:
            if chained is not None or previous is None:
                sys.setprofile(previous)
            else:
                getattr(previous, "enable")()  # cProfile's profiler: it installs itself again

    def guards(self) -> tuple[Guard, ...]:
        """The plain values the noted functions can read, as they are now."""
        found: dict[tuple[int, str], Guard] = {}
        for code, (namespace, cells) in self._frames.items():
            owner = str(namespace.get("__name__", "?"))
            for name in _global_loads(code):
                value = namespace.get(name, _MISSING)
                if value is not _MISSING and plain(value) and (id(namespace), name) not in found:
                    found[(id(namespace), name)] = Guard(namespace, name, _kept(value), owner,
                                                         self._assigned(name, namespace))
            for name, cell in zip(code.co_freevars, cells):
                try:
                    value = cell.cell_contents
                except ValueError:
                    continue
                if plain(value) and (id(cell), name) not in found:
                    found[(id(cell), name)] = Guard(cell, name, _kept(value), code.co_qualname,
                                                    self._assigned(name, None), kind="variable")
        for module, codes in self._modules.values():
            own = module.__dict__
            held = (own.get("_parameters", {}), own.get("_buffers", {}), own.get("_modules", {}))
            for name in {n for code in codes for n in _attribute_loads(code)}:
                value = own.get(name, _MISSING)
                if value is _MISSING or name.startswith("_") or name == "training" or any(name in h for h in held) \
                        or not _changes_in_place(value) or not plain(value) or (id(own), name) in found:
                    continue
                found[(id(own), name)] = Guard(own, name, _kept(value), type(module).__qualname__, kind="attribute")
        return tuple(found.values())

    def _assigned(self, name: str, namespace: dict[str, Any] | None) -> Location | None:
        """Where a noted function assigns ``name`` (a global of ``namespace``; None: a closure variable)."""
        for code, (globals_, _) in self._frames.items():
            if namespace is not None and globals_ is not namespace:
                continue
            line = _global_stores(code).get(name)
            if line is not None:
                return location_of(code.co_filename, line, code.co_name)
        return None


def _changes_in_place(value: Any) -> bool:
    """A value a forward can change without assigning it (a list, dict, set, namespace, dataclass,
    tensor): an attribute assigned anew is :mod:`csrun.compiler.python_state`'s to hear."""
    return isinstance(value, (list, dict, set, types.SimpleNamespace, torch.Tensor)) or \
        (dataclasses.is_dataclass(value) and not isinstance(value, type))


def _cells(frame: types.FrameType) -> tuple[Any, ...]:
    """The closure cells of the method a frame runs (found on its ``self``'s class: frames do not
    name their function; a function nested in the forward gets fresh cells at every call, from the
    enclosing frame's locals, and is not guarded)."""
    code = frame.f_code
    owner = frame.f_locals.get("self") if code.co_freevars else None
    if owner is None:
        return ()
    for klass in type(owner).__mro__:
        for value in vars(klass).values():
            function = getattr(value, "__func__", value)
            if isinstance(function, types.FunctionType) and function.__code__ is code:
                return function.__closure__ or ()
    return ()


def changed(guards: tuple[Guard, ...]) -> Guard | None:
    """The first guard whose value differs now, or None."""
    for guard in guards:
        now = guard.current()
        if now is _MISSING or not _same(now, guard.value):
            return guard
    return None


def as_now(guards: tuple[Guard, ...]) -> tuple[Guard, ...]:
    """The same guards with the values they have now."""
    return tuple(replace(g, value=_kept(now)) for g in guards if (now := g.current()) is not _MISSING)


def global_changes(guards: tuple[Guard, ...]) -> list[CompileError]:
    """A problem for each guarded value that is not its recorded value any more (the CPU run's
    preview: a forward's second call changed what its first left)."""
    return [_changed_by_forward(g, now) for g in guards
            if (now := g.current()) is not _MISSING and not _same(now, g.value)]


def _changed_by_forward(guard: Guard, now: Any) -> ForwardChangesPythonGlobal:
    return ForwardChangesPythonGlobal(
        f"the forward changes the Python {guard.kind} {guard.describe()} each call ({short(guard.value)} -> "
        f"{short(now)})", location=guard.assigned_at)


def short(value: Any) -> str:
    """A value's repr, cut to 60 characters (for notices)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_SINK = threading.local()


@contextlib.contextmanager
def writes_collected() -> Iterator[list[CompileError]]:
    """Collect, as problems, the guarded values a replay inside the block changed (the capture)."""
    sink: list[CompileError] = []
    previous = getattr(_SINK, "sink", None)
    _SINK.sink = sink
    try:
        yield sink
    finally:
        _SINK.sink = previous


@contextlib.contextmanager
def values_set(guards: tuple[Guard, ...]) -> Iterator[None]:
    """The guarded values set to the recorded ones for the block (restored after): a replay of
    the recorded call reads what the recorded call read, and changes nothing the script sees. A
    value the block changed is reported to :func:`writes_collected`'s collector."""
    if not guards:
        yield
        return
    saved = [(g, g.current()) for g in guards]
    for g in guards:
        _put(g, _kept(g.value))  # a copy: a change in place (``CALLS[0] += 1``) shows against the recorded value
    try:
        yield
        sink = getattr(_SINK, "sink", None)
        if sink is not None:
            for g in guards:
                now = g.current()
                if now is not _MISSING and not isinstance(now, torch.Tensor) and not _same(now, g.value) \
                        and not any(p.location == g.assigned_at for p in sink):  # (a tensor: the capture's own)
                    sink.append(_changed_by_forward(g, now))
    finally:
        for g, value in saved:
            _put(g, value)


def _put(guard: Guard, value: Any) -> None:
    if isinstance(guard.where, dict):
        if value is _MISSING:
            guard.where.pop(guard.name, None)
        else:
            guard.where[guard.name] = value
    elif value is not _MISSING:
        guard.where.cell_contents = value
