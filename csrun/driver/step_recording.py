"""Whole-step capture: what a training step computes from the batch, recorded and replayed as one program.

Users write a step the typical way, and csrun captures all of it, as the system traced it::

    inputs, targets = batch                    # the batch's tensors (host values)
    outputs = model(inputs)                    # any number of calls, positional or keyword
    loss = loss_fn(outputs, targets)           # loss modules, functional ops, dict/dataclass outputs
    loss.backward(); optimizer.step()
    acc = (outputs.argmax(1) == targets).float().mean()   # still part of the step
    cm.add_step_closure(log, args=(step, loss, acc))

How it works
------------
On the device path every tensor of the step is a :class:`StepValue`, a tensor subclass whose
``__torch_function__`` sees each torch function or tensor method applied to it. There are two
kinds:

* **Host values**: the batch's tensors as the Session hands them out, and anything computed
  from them alone. Their values are the chief's: such operations run eagerly here, every step,
  and are not recorded; the values can be read anywhere (printing a batch, checking it).
* **Device values**: the wrapped model's outputs and everything computed from them. Their
  values exist on the device once the step has run.

When a host value reaches the device (an argument of a model call, or of an operation on a
device value) it becomes one of the program's **inputs**, numbered in the order the step hands
them over. The step ends at its boundary (the next batch, ``mark_step()``, the end of the
Session); ``loss.backward()`` names the loss. The :class:`StepRecorder` then holds a
:class:`Recording` of the device part:

* **Step 1 records.** Each model call and device operation also runs eagerly on the CPU copies
  (no autograd; buffers and the RNG restored afterwards), only to learn the shapes, dtypes and
  output structures the user's code sees. :meth:`Recording.replay_forward` turns the recording
  into ``forward(inputs) -> {"loss": ..., "v<i>": ...}``: the model's own forward for each call,
  then the recorded operations, which is what ``torch.export`` captures and the compiler
  compiles. ``model(batch)`` returning the loss is the special case of one call and no
  operation.
* **Later steps check.** Nothing of the device part runs on the CPU: each call and operation
  is compared with the compiled one at the same position (function, argument structure,
  constants, input shapes) and answered with new step values of the cached shapes, a few
  microseconds per operation (``bench/emulator/step_capture.py``).
* **A different step is refused.** A call or operation that differs from the compiled one
  (another branch taken, another loss, another shape), a missing or extra one, raises
  :class:`StepChanged` naming the user's file and line and what was compiled there. The
  system ran one compiled step per Session and refused a different one; so does csrun (each
  Session records its first step anew, so a new Session may run another step).

Values of the step
------------------
The program's outputs are the loss and every device value the user still holds when step 1
ends (model outputs, metrics passed to closures). After the boundary a device value reads its
value from the device **inside a step closure** (as an argument, or captured by the closure);
anywhere else every operation on it (``item``, ``float()``, printing, comparison, indexing,
``cpu``, ``detach`` ...) raises the system's hint (:data:`csrun.emulator.errors.READ_HINT`), and so
does a read while the step is open. A value the compiled step did not keep raises
:class:`ValueNotKept` naming the line that made it. ``.to(device)`` on a value of the open step
is the identity (it is on the system already).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.utils._pytree as pytree

from csrun.compiler.capture import tensors_put_back
from csrun.compiler.errors import Location, at
from csrun.compiler.locate import caller_location
from csrun.compiler.python_state import PythonStateWatch, describe_change
from csrun.emulator.errors import READ_HINT, DeviceTensorReadError
from csrun.emulator.update_split import UPDATE_MARKER
from csrun.errors import UserError

# --------------------------------------------------------------------------------------------
# errors


class StepChanged(UserError):
    """A step's calls or operations differ from the compiled step's."""

    def __init__(self, what: str, *, compiled: str, location: Location | None) -> None:
        line = f"\n    {location.source_line}" if location is not None and location.source_line else ""
        super().__init__(
            f"{at(location)}this step differs from the compiled one: {what} (compiled: {compiled}).{line}\n"
            "The system runs the step it compiled on the first batch; make every step of the Session "
            "compute the same thing (the same calls, operations and shapes), or start a new Session.")
        self.location = location


class ValueNotKept(UserError):
    """A step value was read that the compiled step does not hand back."""


class StepValueError(UserError):
    """A step value was used in a way the device path cannot run."""


# --------------------------------------------------------------------------------------------
# templates: a call's arguments with step values replaced by references


@dataclass(frozen=True)
class Ref:
    """A step value, by its number in the step (0.. the batch's leaves, then every result)."""

    index: int


@dataclass(frozen=True)
class Slot:
    """A host value the device consumes: the program's input number ``index`` (in the order the
    step first hands host values to the device)."""

    index: int


@dataclass(frozen=True)
class Const:
    """A tensor that is not a step value (a constant of the step, e.g. a class-weight tensor)."""

    tensor: torch.Tensor

    def same_as(self, other: "Const") -> bool:
        """Same tensor, or an equal small one made anew each step."""
        a, b = self.tensor, other.tensor
        if a is b:
            return True
        if a.shape != b.shape or a.dtype != b.dtype or a.numel() > 4096:
            return False
        return bool(torch.equal(a, b))


GRAD_NORM = -2
"""The reference of the gradient norm ``clip_grad_norm_`` returns: a value the program's update
computes, not its graph (:data:`ENGINE_OUTPUTS`)."""

ENGINE_OUTPUTS = {GRAD_NORM: "grad_norm"}
"""Step values the engine hands back besides the graph's outputs, by reference."""


def _engine_value_used(value: "StepValue") -> StepValueError:
    return StepValueError(
        f"{at(caller_location())}the gradient norm exists only after the program's backward and clipping; pass it "
        "to a step closure (or capture it there) and compute with it there")


_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout,
            type(Ellipsis), torch.Size)


def _template(x: Any) -> Any:
    """``x`` with device values -> :class:`Ref`, host values -> :class:`Slot` (consumed), other
    tensors -> :class:`Const`."""
    if isinstance(x, StepValue):
        if x._host:
            return Slot(x._recorder._consume(x))
        if x._ref < -1:
            raise _engine_value_used(x)
        return Ref(x._ref)
    if isinstance(x, torch.Tensor):
        return Const(x)
    if isinstance(x, _SCALARS):
        return x
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_template(v) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(_template(v) for v in x)
    if isinstance(x, dict):
        return {k: _template(v) for k, v in x.items()}
    if isinstance(x, slice):
        return slice(_template(x.start), _template(x.stop), _template(x.step))
    return x


def _matches(t: Any, x: Any) -> bool:
    """A live argument ``x`` matches the compiled template ``t`` (the per-step check, kept lean)."""
    if isinstance(x, StepValue):
        if x._host:
            return type(t) is Slot and t.index == x._recorder._consume(x)
        if x._ref < -1:
            raise _engine_value_used(x)
        return type(t) is Ref and t.index == x._ref
    if isinstance(x, torch.Tensor):
        return type(t) is Const and t.same_as(Const(x))
    tx = type(x)
    if tx is not type(t):
        return False
    if tx is tuple or tx is list or (isinstance(x, tuple)):
        if len(t) != len(x):
            return False
        for a, b in zip(t, x):  # a loop, not all(<generator>): this runs for every call of every step
            if not _matches(a, b):
                return False
        return True
    if isinstance(x, dict):
        if t.keys() != x.keys():
            return False
        for k in x:
            if not _matches(t[k], x[k]):
                return False
        return True
    if tx is slice:
        return _matches(t.start, x.start) and _matches(t.stop, x.stop) and _matches(t.step, x.step)
    try:
        return bool(t == x)
    except Exception:  # an object without a usable ==: same only if identical
        return t is x


def _fill(t: Any, env: Callable[[int], Any], slots: Sequence[Any] = ()) -> Any:
    """A template with each :class:`Ref` replaced by ``env(index)``, each :class:`Slot` by its
    input and constants by their tensors."""
    if isinstance(t, Ref):
        return env(t.index)
    if isinstance(t, Slot):
        return slots[t.index]
    if isinstance(t, Const):
        return t.tensor
    if isinstance(t, tuple) and hasattr(t, "_fields"):
        return type(t)(*(_fill(v, env, slots) for v in t))
    if isinstance(t, (list, tuple)):
        return type(t)(_fill(v, env, slots) for v in t)
    if isinstance(t, dict):
        return {k: _fill(v, env, slots) for k, v in t.items()}
    if isinstance(t, slice):
        return slice(_fill(t.start, env, slots), _fill(t.stop, env, slots), _fill(t.step, env, slots))
    return t


def _template_leaves(t: Any) -> Iterator[Any]:
    """Every leaf of a template (through tuples, lists, dicts and slices)."""
    if isinstance(t, (list, tuple)):
        for v in t:
            yield from _template_leaves(v)
    elif isinstance(t, dict):
        for v in t.values():
            yield from _template_leaves(v)
    elif isinstance(t, slice):
        yield from _template_leaves((t.start, t.stop, t.step))
    else:
        yield t


def _has_refs(t: Any) -> bool:
    """Whether a template holds a :class:`Ref` or :class:`Slot`."""
    return any(isinstance(x, (Ref, Slot)) for x in _template_leaves(t))


def _ref_indices(t: Any) -> Iterator[int]:
    """The value numbers a template reads."""
    return (x.index for x in _template_leaves(t) if isinstance(x, Ref))


def _has_slots(t: Any) -> bool:
    """Whether a template takes a host value (a program input)."""
    return any(isinstance(x, Slot) for x in _template_leaves(t))


def _constants(t: Any) -> Iterator[Const]:
    """Every :class:`Const` in a template."""
    return (x for x in _template_leaves(t) if isinstance(x, Const))


def _sketch(x: Any) -> Any:
    """Live arguments as a template for messages only (consumes nothing)."""
    if isinstance(x, StepValue):
        return Slot(x._slot if x._slot is not None else -1) if x._host else Ref(x._ref)
    if isinstance(x, torch.Tensor):
        return Const(x)
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        return type(x)(_sketch(v) for v in x)
    if isinstance(x, dict):
        return {k: _sketch(v) for k, v in x.items()}
    return x


def _describe_call(args: Any, kwargs: Any) -> str:
    """``(a, b, k=v)`` of a call's templates."""
    inner = ", ".join([_describe(v) for v in tuple(args)] + [f"{k}={_describe(v)}" for k, v in (kwargs or {}).items()])
    return f"({inner})"


def _describe(t: Any) -> str:
    if isinstance(t, Ref):
        return f"v{t.index}"
    if isinstance(t, Slot):
        return f"input{t.index}" if t.index >= 0 else "a batch value"
    if isinstance(t, Const):
        return f"tensor{tuple(t.tensor.shape)}"
    if isinstance(t, (list, tuple)):
        inner = ", ".join(_describe(v) for v in t)
        return f"({inner})" if isinstance(t, tuple) else f"[{inner}]"
    if isinstance(t, dict):
        return "{" + ", ".join(f"{k}={_describe(v)}" for k, v in t.items()) + "}"
    return repr(t)


# --------------------------------------------------------------------------------------------
# outputs of a call: any nesting of tensors in tuples, lists, dicts, dataclasses (ModelOutput)


def flatten_output(obj: Any) -> tuple[list[Any], Callable[[list[Any]], Any]]:
    """The tensor leaves of a call's result and a function that rebuilds it around new leaves.

    Handles tensors, tuples (named too), lists, dicts (``OrderedDict`` and Hugging Face's
    ``ModelOutput`` too) and dataclasses; anything else is a constant of the structure.
    """
    if isinstance(obj, torch.Tensor):
        return [obj], lambda leaves: leaves[0]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and not isinstance(obj, dict):
        names = [f.name for f in dataclasses.fields(obj)]
        parts = [flatten_output(getattr(obj, n)) for n in names]
        return _combine(parts, lambda values: dataclasses.replace(obj, **dict(zip(names, values))))
    if isinstance(obj, dict):
        keys = list(obj.keys())
        parts = [flatten_output(obj[k]) for k in keys]

        def make_dict(values: list[Any]) -> Any:
            if dataclasses.is_dataclass(obj):  # ModelOutput: a dataclass and an OrderedDict
                return type(obj)(**dict(zip(keys, values)))
            out = type(obj)() if type(obj) is not dict else {}
            out.update(zip(keys, values))
            return out

        return _combine(parts, make_dict)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        parts = [flatten_output(v) for v in obj]
        return _combine(parts, lambda values: type(obj)(*values))
    if isinstance(obj, (list, tuple)):
        parts = [flatten_output(v) for v in obj]
        return _combine(parts, lambda values: type(obj)(values))
    return [], lambda leaves: obj


def _combine(parts: list[tuple[list[Any], Callable[[list[Any]], Any]]],
             make: Callable[[list[Any]], Any]) -> tuple[list[Any], Callable[[list[Any]], Any]]:
    leaves: list[Any] = []
    sizes: list[int] = []
    for part_leaves, _ in parts:
        leaves.extend(part_leaves)
        sizes.append(len(part_leaves))

    def rebuild(new: list[Any]) -> Any:
        values, at = [], 0
        for (_, sub), n in zip(parts, sizes):
            values.append(sub(new[at:at + n]))
            at += n
        return make(values)

    return leaves, rebuild


# --------------------------------------------------------------------------------------------
# the recording


@dataclass
class Entry:
    """One recorded call (``func is None``: the wrapped model) or operation."""

    func: Callable[..., Any] | None
    args: Any
    kwargs: Any
    results: tuple[int, ...]
    """Numbers of the step values the call produced, in :func:`flatten_output` order."""
    result_meta: tuple[tuple[torch.Size, torch.dtype], ...]
    rebuild: Callable[[list[Any]], Any]
    location: Location | None
    plain_kwargs: bool = False
    """The keyword arguments hold no tensor: a later call's are compared with ``==``."""
    after_update: bool = False
    """Sees the updated weights: a model call after ``optimizer.step()``, or an operation on the
    values of one (the program runs it after the update). An operation after ``step()`` on values
    made before it computes the same either way, and stays in the first part."""
    grad: bool = True
    """Grad mode was on (under ``torch.no_grad()`` no gradient flows back through its results)."""
    modes: tuple[bool, ...] | None = None
    """A model call's module modes: ``training`` of each of ``model.modules()``."""
    guards: dict[tuple[int, str], Any] | None = None
    """A model call's Python values: those the script has assigned to the model's modules
    (:mod:`csrun.compiler.python_state`), as they were when the call was recorded."""
    guard_names: tuple[str, ...] = ()
    """``path.attribute = value`` of each guard, for the signature and messages."""

    def describe(self) -> str:
        """``name(args, keywords)`` as the user would recognise it."""
        name = "model" if self.func is None else getattr(self.func, "__name__", repr(self.func))
        at = f" at {self.location.filename}:{self.location.lineno}" if self.location else ""
        return f"{name}{_describe_call(self.args, self.kwargs)}{at}"


@dataclass
class Recording:
    """A whole step: the batch's structure, its calls and operations, the loss and the kept values."""

    entries: list[Entry] = field(default_factory=list)
    inputs: list[tuple[torch.Size, torch.dtype]] = field(default_factory=list)
    """Shape and dtype of each program input (the host values the device consumes, in order)."""
    loss: int | None = None
    """The value ``backward()`` was called on (None in an eval step)."""
    kept: tuple[int, ...] = ()
    """Values handed back besides the loss: model outputs and what the user held at the end."""
    value_lines: dict[int, Location | None] = field(default_factory=dict)
    _signature: str | None = field(default=None, repr=False)
    _optional: frozenset[int] | None = field(default=None, repr=False)

    def optional(self) -> frozenset[int]:
        """Positions of the operations whose results nothing uses: no output, no later entry reads
        them, not in place, no new input (e.g. the ``detach()`` of a ``loss.detach().item()`` whose
        read was refused and caught). They change no output, so a later step may leave them out."""
        if self._optional is None:
            needed = set(self.output_names)
            dead: set[int] = set()
            for pos in range(len(self.entries) - 1, -1, -1):
                e = self.entries[pos]
                name = getattr(e.func, "__name__", "")
                if (e.func is not None and not needed.intersection(e.results) and not name.endswith("_")
                        and not _has_slots((e.args, e.kwargs))):
                    dead.add(pos)
                    continue
                needed.update(_ref_indices((e.args, e.kwargs)))
            self._optional = frozenset(dead)
        return self._optional

    def signature(self) -> str:
        """A stable text of the step (calls, operations, constants' digests, loss, kept values):
        which program runs it (computed once)."""
        if self._signature is not None:
            return self._signature
        lines = [f"inputs {_describe_meta(tuple(self.inputs))}"]
        for e in self.entries:
            name = "model" if e.func is None else f"{getattr(e.func, '__module__', '')}.{getattr(e.func, '__qualname__', repr(e.func))}"
            how = (f"{' after update' if e.after_update else ''}{'' if e.grad else ' no_grad'}{_describe_modes(e.modes)}"
                   f"{' with ' + ', '.join(e.guard_names) if e.guard_names else ''}")
            lines.append(f"{name}{_describe(tuple(e.args))}{_describe(e.kwargs)} -> {list(e.results)}{how}")
        lines.append(f"loss {self.loss} kept {list(self.kept)}")
        consts = [c for e in self.entries for c in _constants((e.args, e.kwargs))]
        digest = hashlib.sha256()
        for c in consts:
            digest.update(c.tensor.detach().cpu().contiguous().numpy().tobytes())
        lines.append(f"constants {len(consts)} {digest.hexdigest()[:16]}")
        self._signature = "\n".join(lines)
        return self._signature

    @property
    def output_names(self) -> dict[int, str]:
        """Value number -> the program's output name (``loss`` first)."""
        names: dict[int, str] = {}
        if self.loss is not None:
            names[self.loss] = "loss"
        for i in self.kept:
            names.setdefault(i, f"v{i}")
        return names

    @property
    def after_update(self) -> tuple[str, ...]:
        """Names of the outputs made after ``optimizer.step()`` (the program computes them after the update)."""
        late = {i for e in self.entries if e.after_update for i in e.results}
        return tuple(name for i, name in self.output_names.items() if i in late)

    def replay_forward(self, call_model: Callable[..., Any],
                       model: torch.nn.Module | None = None) -> Callable[[Any], dict[str, torch.Tensor]]:
        """``forward(inputs)`` replaying the step's device part on its inputs (a tuple), as
        :meth:`run` does; the first value made after ``optimizer.step()`` is preceded by the
        :data:`UPDATE_MARKER` output (where the engine splits the program:
        :mod:`csrun.emulator.update_split`)."""
        n_inputs = len(self.inputs)
        split = any(e.after_update for e in self.entries)

        def forward(inputs: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
            if len(inputs) != n_inputs:
                raise StepValueError(f"the step has {len(inputs)} inputs; the recorded step had {n_inputs}")
            marker: list[torch.Tensor] = []
            out = self.run(call_model, model, list(inputs),
                           at_update=lambda env: marker.append(torch.zeros(())) if split else None)
            if marker:
                out[UPDATE_MARKER] = marker[0]
            if "loss" not in out:  # an eval step with no scalar loss of its own
                out["loss"] = torch.zeros((), dtype=torch.float32)
            return out

        return forward

    def run(self, call_model: Callable[..., Any], model: torch.nn.Module | None, inputs: list[Any], *,
            at_update: Callable[[dict[int, Any]], Any] = lambda env: None,
            recorded_on: torch.nn.Module | None = None) -> dict[str, Any]:
        """Run the step's calls and operations on ``inputs`` (the program's inputs), eagerly:
        ``call_model(*args, **kwargs)`` runs the model's own forward, with ``model``'s modules in
        the modes and Python values of the recorded call (``recorded_on``: the model the step was
        recorded on, when ``model`` is a copy of it); results made under ``no_grad`` are
        detached; ``at_update(values)`` is called where ``optimizer.step()`` was, before the first
        value made after it (at the end when nothing came after it). Returns the outputs by name
        (``loss``, ``v<i>``)."""
        modules = list(model.modules()) if model is not None else []
        originals = list(recorded_on.modules()) if recorded_on is not None else modules
        by_id = {id(o): m for o, m in zip(originals, modules)}
        env: dict[int, Any] = {}
        updated = False
        for e in self.entries:
            if e.after_update and not updated:
                at_update(env)
                updated = True
            args = _fill(e.args, env.__getitem__, inputs)
            kwargs = _fill(e.kwargs, env.__getitem__, inputs)
            if e.func is None:
                with _modes_set(modules, e.modes), _values_set(by_id, e.guards):
                    out = call_model(*args, **kwargs)
            else:
                out = e.func(*args, **kwargs)
            leaves, _ = flatten_output(out)
            if not e.grad:
                leaves = [v.detach() if isinstance(v, torch.Tensor) else v for v in leaves]
            env.update(zip(e.results, leaves))
        if not updated:
            at_update(env)
        return {name: env[i] for i, name in self.output_names.items()}


def _describe_modes(modes: tuple[bool, ...] | None) -> str:
    if modes is None:
        return ""
    if all(modes):
        return " train"
    return " eval" if not any(modes) else " modes " + "".join("T" if m else "E" for m in modes)


@contextlib.contextmanager
def _modes_set(modules: list[torch.nn.Module], modes: tuple[bool, ...] | None) -> Iterator[None]:
    """The modules' ``training`` flags set to ``modes`` for the block (restored after)."""
    if modes is None or len(modes) != len(modules):
        yield
        return
    saved = [m.training for m in modules]
    for m, flag in zip(modules, modes):
        m.training = flag
    try:
        yield
    finally:
        for m, flag in zip(modules, saved):
            m.training = flag


@contextlib.contextmanager
def _values_set(by_id: dict[int, torch.nn.Module], guards: dict[tuple[int, str], Any] | None) -> Iterator[None]:
    """The modules' Python values set to those a call was recorded with, for the block (restored
    after; set in ``__dict__``, past the watch: this is the replay, not the script)."""
    if not guards:
        yield
        return
    saved = []
    for (i, name), value in guards.items():
        module = by_id.get(i)
        if module is not None:
            saved.append((module, name, module.__dict__.get(name, _UNSET)))
            module.__dict__[name] = value
    try:
        yield
    finally:
        for module, name, value in saved:
            if value is _UNSET:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = value


_UNSET: Any = object()


# --------------------------------------------------------------------------------------------
# step values


_STATE = threading.local()


@contextlib.contextmanager
def in_closure() -> Iterator[None]:
    """Step values read their device value inside this block (the step-closure runner uses it)."""
    depth = getattr(_STATE, "closure_depth", 0)
    _STATE.closure_depth = depth + 1
    try:
        yield
    finally:
        _STATE.closure_depth = depth


def _inside_closure() -> bool:
    return getattr(_STATE, "closure_depth", 0) > 0


_METADATA = frozenset({
    "size", "dim", "ndimension", "numel", "nelement", "is_floating_point", "is_complex", "element_size",
    "get_device", "is_contiguous", "stride", "storage_offset", "__len__",
})
_METADATA_PROPERTIES = frozenset({
    "shape", "dtype", "device", "ndim", "is_cuda", "is_sparse", "is_quantized", "is_meta", "layout",
    "requires_grad", "is_leaf", "grad_fn", "names", "itemsize", "nbytes",
})
_READS = {
    "item": "call .item() on", "tolist": "call .tolist() on", "numpy": "call .numpy() on",
    "__bool__": "take the truth value of", "__float__": "take float() of", "__int__": "take int() of",
    "__index__": "use as an index", "__format__": "format", "__repr__": "print", "__str__": "print",
    "__array__": "convert to an array", "__reduce_ex__": "pickle", "__deepcopy__": "copy",
    "data_ptr": "take the address of", "untyped_storage": "take the storage of", "__iter__": "iterate over",
}
"""Operations that need a value: refused while the step is open (its values are on the device)."""
_DEVICE_MOVES = frozenset({"to", "cuda", "cpu"})
"""On a step value that belongs to an open step, ``.to(device)`` is the identity (the value
is on the system already); a ``.to(dtype)`` is recorded."""


def _func_name(func: Any) -> str:
    name = getattr(func, "__name__", "")
    if name == "__get__":
        owner = getattr(func, "__self__", None)
        name = getattr(owner, "__name__", "") or getattr(getattr(owner, "fget", None), "__name__", "")
    return name


_KINDS: dict[Any, tuple[str, str]] = {}


def _kind(func: Any) -> tuple[str, str]:
    """(kind, name) of a torch function: ``meta`` (shape, dtype ...: answered here) or ``op``; cached."""
    try:
        return _KINDS[func]
    except (KeyError, TypeError):
        pass
    name = _func_name(func)
    kind = ("meta", name) if name in _METADATA_PROPERTIES or name in _METADATA else ("op", name)
    try:
        _KINDS[func] = kind
    except TypeError:  # an unhashable callable: not cached
        pass
    return kind


class _Scan:
    """One walk over (nested) arguments: the first step value, and whether any is a device value."""

    __slots__ = ("first", "device")

    def __init__(self) -> None:
        self.first: StepValue | None = None
        self.device = False

    def walk(self, x: Any) -> None:
        if isinstance(x, StepValue):
            if self.first is None:
                self.first = x
            if not x._host:
                self.device = True
        elif isinstance(x, (list, tuple)):
            for v in x:
                self.walk(v)
        elif isinstance(x, dict):
            for v in x.values():
                self.walk(v)


class StepValue(torch.Tensor):
    """A tensor of a step on the device: shape and dtype here, the value on the device (module manual)."""

    _recorder: "StepRecorder"
    _ref: int
    _step: "StepState"
    _value: torch.Tensor | None
    _host: bool
    _slot: int | None

    @staticmethod
    def __new__(cls, recorder: "StepRecorder", step: "StepState", ref: int, shape: torch.Size,
                dtype: torch.dtype, value: torch.Tensor | None = None, *, host: bool = False) -> "StepValue":
        out = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=torch.device("cpu"), requires_grad=False)
        out._recorder = recorder
        out._step = step
        out._ref = ref
        out._value = value
        out._host = host
        out._slot = None
        return out

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        kind, name = _kind(func)
        if kind == "meta":
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        found = _Scan()
        found.walk(args)
        if kwargs:
            found.walk(kwargs)
        first = found.first
        if first is None:  # e.g. a torch function that got a step value's type only
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        return first._recorder.operation(func, name, first, args, kwargs, found.device)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        raise StepValueError(
            f"{func} reached a step value below torch's Python layer; step values take torch functions "
            "and tensor methods (csrun records them) — please report this with the line that made it")


@dataclass(eq=False)
class StepState:
    """One step's values: open (recording or checking) until the boundary, then closed."""

    number: int
    open: bool = True
    inputs: tuple[torch.Tensor, ...] = ()
    """After the boundary: the program's inputs (what is sent to the device)."""
    recording: "Recording | None" = None
    """After the boundary: the step's recording (which value is which output)."""
    outputs: Callable[[], dict[str, torch.Tensor]] | None = None
    """After the step was sent: its outputs as CPU tensors by name (waits for the device)."""


# --------------------------------------------------------------------------------------------
# the recorder


class StepRecorder:
    """Records step 1 (:class:`Recording`) and checks every later step against it."""

    def __init__(self, notice: Callable[[str], None] | None = None) -> None:
        """``notice``: where the one-line notice of a recompile goes (a Python value changed)."""
        self.notice = notice or (lambda text: None)
        self.recording: Recording | None = None
        """The compiled step's recording (None until :meth:`compiled` is called)."""
        self._guard_version = -1
        self._noticed: set[str] = set()
        self.watch: PythonStateWatch | None = None
        """The Python values assigned to the model's modules (the driver shares one per model)."""
        self._draft: Recording | None = None
        self._step: StepState | None = None
        self._pos = 0
        self._n = 0
        self._live: list[weakref.ref[StepValue]] = []
        self._on_backward: Callable[[], None] | None = None
        self._after_update = False
        """``optimizer.step()`` ran in the open step."""
        self._late: set[int] = set()
        """Values of the open step that see the updated weights."""
        self._modules: dict[int, list[torch.nn.Module]] = {}
        self._modes_seen: dict[int, tuple[int, tuple[bool, ...]]] = {}

    # -- the step's life ----------------------------------------------------------------------

    @property
    def recording_step(self) -> bool:
        """True while step 1 is being recorded (its calls also run on the CPU)."""
        return self._draft is not None

    @property
    def step_open(self) -> bool:
        """True between :meth:`begin` and :meth:`end`."""
        return self._step is not None and self._step.open

    def begin(self, batch: Any, number: int) -> Any:
        """Start step ``number``: the batch with its tensors as host step values."""
        if self.step_open:
            raise StepValueError("a new step began before the previous one ended (csrun bug)")
        self._step = StepState(number=number)
        self._after_update = False
        self._late = set()
        self._pos = 0
        self._n = 0
        self._live = []
        self._slots: list[StepValue] = []
        self._draft = Recording() if self.recording is None else None
        step = self._step

        def host(leaf: Any) -> Any:
            if isinstance(leaf, torch.Tensor) and not isinstance(leaf, StepValue):
                return StepValue(self, step, -1, leaf.shape, leaf.dtype, leaf, host=True)
            return leaf

        return pytree.tree_map(host, batch)

    def end(self) -> tuple[Recording, StepState]:
        """The step's boundary: its recording (step 1: complete, with the kept values) and its
        state (with the inputs to send)."""
        step = self._step
        if step is None or not step.open:
            raise StepValueError("no step is open (csrun bug)")
        if self._draft is not None:
            draft = self._draft
            produced = {i for e in draft.entries for i in e.results}
            alive = {v._ref for v in (w() for w in self._live) if v is not None and not v._host}
            model_outputs = {i for e in draft.entries if e.func is None for i in e.results}
            if draft.loss is None:  # an eval step: the program's "loss" is the step's own, if it has one
                draft.loss = _eval_loss(draft)
            draft.kept = tuple(sorted((alive | model_outputs) & produced - ({draft.loss} if draft.loss is not None else set())))
            recording = draft
        else:
            recording = self.recording  # type: ignore[assignment]
            optional = recording.optional()
            while self._pos < len(recording.entries) and self._pos in optional:
                self._pos += 1  # operations nothing used, left out at the end of this step
            if self._pos != len(recording.entries):
                missing = recording.entries[self._pos]
                raise StepChanged("the step ended early", compiled=f"then {missing.describe()}", location=caller_location())
            if len(self._slots) != len(recording.inputs):
                raise StepChanged(f"the device took {len(self._slots)} inputs from the batch",
                                  compiled=f"{len(recording.inputs)} inputs", location=caller_location())
        step.inputs = tuple(v._value for v in self._slots)  # type: ignore[misc]
        step.open = False
        step.recording = recording
        self._live = []
        self._slots = []
        return recording, step

    def _consume(self, value: StepValue) -> int:
        """A host value handed to the device: its input number (the next one if new), checked
        against the compiled step's input shapes."""
        if value._slot is not None and value._step is self._step:
            return value._slot
        index = len(self._slots)
        shape, dtype = value.shape, value.dtype
        if self._draft is not None:
            self._draft.inputs.append((shape, dtype))
        elif self.recording is not None:
            if index >= len(self.recording.inputs):
                raise StepChanged(f"an extra input {tuple(shape)} {dtype} from the batch", compiled="no more inputs",
                                  location=caller_location())
            want = self.recording.inputs[index]
            if (shape, dtype) != want:
                raise StepChanged(f"an input of shape {tuple(shape)} {str(dtype).removeprefix('torch.')} (the batch's "
                                  "shapes changed: sizes must be static)", compiled=_describe_meta((want,)),
                                  location=caller_location())
        value._slot = index
        self._slots.append(value)
        return index

    def abandon(self) -> None:
        """The Session failed inside the open step: close it without a recording or inputs. Its
        host values (the batch and what the loop computed from it alone) become plain readable
        values, as after any step's boundary; its device values never ran."""
        if self._step is not None:
            self._step.open = False
        self._live = []
        self._slots = []
        self._on_backward = None

    def engine_value(self, ref: int, shape: torch.Size, dtype: torch.dtype) -> "StepValue":
        """A device value of the open step that the engine computes besides the graph
        (:data:`ENGINE_OUTPUTS`), e.g. the gradient norm ``clip_grad_norm_`` returns."""
        if self._step is None or not self._step.open:
            raise StepValueError("no step is open (csrun bug)")
        return StepValue(self, self._step, ref, shape, dtype)

    def compiled(self, recording: Recording) -> None:
        """Step 1's recording was compiled: later steps are checked against it."""
        self.recording = recording
        self._draft = None

    def reset(self) -> None:
        """Forget the compiled step (a new Session compiles its own)."""
        self.recording = None
        self._draft = None
        self._step = None
        self._modules = {}
        self._modes_seen = {}

    def optimizer_stepped(self) -> None:
        """``optimizer.step()`` ran in the open step: what follows sees the updated weights."""
        self._after_update = True

    def _modes(self, model: torch.nn.Module, watch: PythonStateWatch) -> tuple[bool, ...]:
        """The ``training`` flags of the model's modules (read again only when one was assigned)."""
        cached = self._modes_seen.get(id(model))
        if cached is not None and cached[0] == watch.mode_version:
            return cached[1]
        modules = self._modules.get(id(model))
        if modules is None:
            modules = self._modules[id(model)] = list(model.modules())
        modes = tuple(m.training for m in modules)
        self._modes_seen[id(model)] = (watch.mode_version, modes)
        return modes

    # -- calls and operations -----------------------------------------------------------------

    def model_call(self, model: torch.nn.Module, forward: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any], *, on_backward: Callable[[], None] | None = None) -> Any:
        """The wrapped model was called: record it (step 1, running ``forward`` on CPU values) or check it.

        ``on_backward`` is called when ``backward()`` is called on a value of this step."""
        self._require_open("model(...)")
        if on_backward is not None:
            self._on_backward = on_backward
        watch = self._watch(model)
        modes = self._modes(model, watch)
        if self._draft is None and watch.version != self._guard_version:
            self._check_guards(model, watch)
        if self._draft is not None:
            with _shadow_run(model), torch.no_grad():
                out = forward(*_values(args), **_values(kwargs))
            result = self._record(None, args, kwargs, out, modes)
            entry = self._draft.entries[-1]
            entry.guards = watch.guards()
            entry.guard_names = self._guard_names(model, entry.guards)
            self._guard_version = watch.version
            return result
        return self._check(None, args, kwargs, modes)

    def _watch(self, model: torch.nn.Module) -> PythonStateWatch:
        if self.watch is None:
            self.watch = PythonStateWatch(model)
        return self.watch

    def _check_guards(self, model: torch.nn.Module, watch: PythonStateWatch) -> None:
        """Before a model call of a later step: the Python values the script assigned since the
        step was recorded must be those of the recorded call here. A changed one recompiles the
        step (one notice naming the line that changed it), or, in the middle of a step, is refused."""
        recording = self.recording
        self._guard_version = watch.version
        if recording is None or self._pos >= len(recording.entries):
            return
        entry = recording.entries[self._pos]
        if entry.func is not None or entry.guards is None:
            return
        change = watch.changed_since(entry.guards)
        if change is None:
            return
        what = describe_change(change, model)
        if self._pos != 0:
            raise StepChanged(f"a Python value the model reads changed within the step ({what})",
                              compiled=entry.describe(), location=caller_location())
        line = f"{change.location.filename}:{change.location.lineno}" if change.location else what
        if line not in self._noticed:  # once per line; each change recompiles
            self._noticed.add(line)
            self.notice(f"{what}: the step depends on it, so it is compiled again (the device runs the step it "
                        "compiled; a value that changes every step recompiles every step)")
        self.recording = None
        self._draft = Recording()

    def _guard_names(self, model: torch.nn.Module, guards: dict[tuple[int, str], Any]) -> tuple[str, ...]:
        paths = {id(m): n for n, m in model.named_modules()}
        return tuple(sorted(f"{paths.get(i, '?')}{'.' if paths.get(i) else ''}{name}={value!r}"
                            for (i, name), value in guards.items()))

    def operation(self, func: Any, name: str, first: StepValue, args: tuple[Any, ...],
                  kwargs: dict[str, Any], device: bool = True) -> Any:
        """A torch function or tensor method applied to step values (``StepValue.__torch_function__``);
        ``device``: some argument is a device value (else all are host values)."""
        step = first._step
        if not step.open:
            if not device:  # the batch's values are the chief's: readable anywhere
                return self._closed_host(func, args, kwargs)
            return self._closed(step, func, name, args, kwargs)
        if step is not self._step:
            raise StepValueError(f"a value of step {step.number} was used in step {self._step.number if self._step else '?'}; "
                                 "values of a step are read in its step closures")
        if name == "backward":
            return self._backward(first)
        if not device:
            return self._on_host(func, args, kwargs)
        if name in _READS:
            raise DeviceTensorReadError(f"cannot {_READS[name]} a device tensor here: {READ_HINT}")
        if name in _DEVICE_MOVES and _is_device_move(args, kwargs):
            return args[0]
        if self._draft is not None:
            with torch.no_grad():
                out = func(*_values(args), **_values(kwargs))
            result = self._record(func, args, kwargs, out)
        else:
            result = self._check(func, args, kwargs)
        if name.endswith("_") and not name.endswith("__") and isinstance(args[0], StepValue) and isinstance(result, StepValue):
            args[0]._ref = result._ref  # in place: the variable now names the result
            args[0]._value = result._value
            return args[0]
        return result

    # -- internals ----------------------------------------------------------------------------

    def _on_host(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Operations on the batch alone run here, on the chief, every step (not recorded): their
        tensor results stay host values, so the device takes them as inputs where it needs them."""
        step = self._step
        assert step is not None  # noqa: S101 - the step is open
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*_values(args), **_values(kwargs))

        def wrap(t: Any) -> Any:
            if isinstance(t, torch.Tensor) and not isinstance(t, StepValue):
                return StepValue(self, step, -1, t.shape, t.dtype, t, host=True)
            return t

        return pytree.tree_map(wrap, out) if isinstance(out, (torch.Tensor, tuple, list)) else out

    def _require_open(self, what: str) -> None:
        if not self.step_open:
            raise StepValueError(f"{what} was called outside a step: on the system the model runs on the batches "
                                 "the Session's dataloader hands out (for batch in dataloader: ...)")

    def _backward(self, loss: StepValue) -> None:
        if self._on_backward is not None:
            self._on_backward()
        if loss.numel() != 1 or not loss.dtype.is_floating_point:
            raise StepValueError(f"backward() on a {tuple(loss.shape)} {loss.dtype} value: the loss must be a scalar float "
                                 "(reduce it, e.g. loss.mean())")
        if self._draft is not None:
            if self._draft.loss is not None:
                raise StepValueError("backward() was called twice in one step; the system runs one backward per step "
                                     "(add the losses and call backward() once)")
            self._draft.loss = loss._ref
        elif self.recording is not None and loss._ref != self.recording.loss:
            raise StepChanged("backward() on another value", compiled="backward() on the loss", location=caller_location())
        return None

    def _record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                modes: tuple[bool, ...] | None = None) -> Any:
        assert self._draft is not None and self._step is not None  # noqa: S101 - internal invariant
        leaves, rebuild = flatten_output(out)
        results, meta, wrapped = [], [], []
        for leaf in leaves:
            ref = self._n
            self._n += 1
            v = StepValue(self, self._step, ref, leaf.shape, leaf.dtype, leaf.detach())
            self._live.append(weakref.ref(v))
            results.append(ref)
            meta.append((leaf.shape, leaf.dtype))
            wrapped.append(v)
        loc = caller_location()
        targs, kw = _template(args), _template(kwargs)
        late = self._after_update if func is None else any(i in self._late for i in _ref_indices((targs, kw)))
        entry = Entry(func=func, args=targs, kwargs=kw, results=tuple(results),
                      result_meta=tuple(meta), rebuild=rebuild, location=loc, plain_kwargs=not any(_constants(kw))
                      and not _has_refs(kw), after_update=late, grad=torch.is_grad_enabled(), modes=modes)
        if late:
            self._late.update(results)
        for r in results:
            self._draft.value_lines[r] = loc
        self._draft.entries.append(entry)
        return rebuild(wrapped)

    def _check(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               modes: tuple[bool, ...] | None = None) -> Any:
        recording = self.recording
        assert recording is not None and self._step is not None  # noqa: S101 - internal invariant
        if self._pos >= len(recording.entries):
            what = "model" if func is None else getattr(func, "__name__", repr(func))
            raise StepChanged(f"an extra call {what}(...) after the compiled step's last one", compiled="nothing more",
                              location=caller_location())
        entry = recording.entries[self._pos]
        if not _same_call(entry, func, args, kwargs):
            entry = self._past_unused(recording, func, args, kwargs)
        if (func is None and entry.after_update != self._after_update) or entry.grad != torch.is_grad_enabled() \
                or entry.modes != modes:
            raise StepChanged(_how_it_differs(entry, self._after_update, modes), compiled=entry.describe(),
                              location=caller_location())
        self._pos += 1
        wrapped = []
        for ref, (shape, dtype) in zip(entry.results, entry.result_meta):
            v = StepValue(self, self._step, ref, shape, dtype)
            wrapped.append(v)
        self._n = max(self._n, (entry.results[-1] + 1) if entry.results else self._n)
        return entry.rebuild(wrapped)

    def _past_unused(self, recording: Recording, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Entry:
        """The call does not match the compiled one at its place: past operations nothing used
        (a caught read's ``detach()``, which this step left out), the entry it is; else refused."""
        optional = recording.optional()
        first = recording.entries[self._pos]
        while self._pos in optional and self._pos + 1 < len(recording.entries):
            self._pos += 1
            entry = recording.entries[self._pos]
            if _same_call(entry, func, args, kwargs):
                return entry
        name = "model" if func is None else getattr(func, "__name__", repr(func))
        raise StepChanged(f"{name}{_describe_call(_sketch(tuple(args)), _sketch(kwargs))}", compiled=first.describe(),
                          location=caller_location())

    def _closed(self, step: StepState, func: Any, name: str,
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not _inside_closure():
            raise DeviceTensorReadError(f"cannot use {name or 'an operation'} on a device tensor of step {step.number} "
                                        f"here: {READ_HINT}")
        real = pytree.tree_map(lambda x: self._value_of(x) if isinstance(x, StepValue) else x, (args, kwargs))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*real[0], **real[1])

    def _closed_host(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            return func(*_values(args), **_values(kwargs))

    def _value_of(self, value: StepValue) -> torch.Tensor:
        step = value._step
        if value._host:
            return value._value  # type: ignore[return-value]
        if step.outputs is None or step.recording is None:
            raise DeviceTensorReadError(f"step {step.number} has not been sent to the device yet: {READ_HINT}")
        name = step.recording.output_names.get(value._ref) or ENGINE_OUTPUTS.get(value._ref)
        if name is None:
            loc = step.recording.value_lines.get(value._ref)
            where = f" (made at {loc.filename}:{loc.lineno}: {loc.source_line})" if loc is not None else ""
            raise ValueNotKept(f"this step value{where} is not one the compiled step hands back: the step keeps the loss, "
                               "the model's outputs and the values still held when the first step ended; keep a "
                               "reference to it (e.g. pass it to the step closure) in the first step too")
        return step.outputs()[name]


def _same_call(entry: Entry, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a live call is the compiled ``entry`` (function, arguments' structure and constants)."""
    return entry.func is func and _matches(entry.args, args) and (
        entry.kwargs == kwargs if entry.plain_kwargs else _matches(entry.kwargs, kwargs))


def _how_it_differs(entry: Entry, after_update: bool, modes: tuple[bool, ...] | None) -> str:
    """What differs between a call and the compiled one at its place: update, grad mode or module modes."""
    if entry.after_update != after_update:
        return ("this runs after optimizer.step(), on the updated weights" if after_update
                else "this runs before optimizer.step() (or in a step without it)")
    if entry.grad != torch.is_grad_enabled():
        return "this runs with grad mode " + ("on" if torch.is_grad_enabled() else "off (torch.no_grad())")
    return f"the model is called in{_describe_modes(modes)} mode"


def _eval_loss(recording: Recording) -> int | None:
    """The value an eval step's program hands back as ``loss``: the model's own (a scalar it
    returns, or its ``loss`` entry), else the last scalar float the step computed."""
    scalars = {i for e in recording.entries for i, (shape, dtype) in zip(e.results, e.result_meta)
               if len(shape) == 0 and dtype.is_floating_point}
    for e in recording.entries:
        if e.func is None and e.results and e.results[0] in scalars:
            names = e.rebuild(list(e.results))
            if isinstance(names, dict) and isinstance(names.get("loss"), int):
                return names["loss"]
            if isinstance(names, int):
                return names
    last = [i for e in recording.entries for i in e.results if i in scalars]
    return last[-1] if last else None


def _describe_meta(meta: tuple[tuple[torch.Size, torch.dtype], ...]) -> str:
    return ", ".join(f"{tuple(s)} {str(d).removeprefix('torch.')}" for s, d in meta)


def _is_device_move(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``x.to(device)`` / ``x.cuda()`` / ``x.cpu()`` without a dtype change."""
    rest = list(args[1:]) + list(kwargs.values())
    return all(isinstance(a, (torch.device, str, int, bool, type(None))) for a in rest) and \
        not any(isinstance(a, torch.dtype) for a in rest)


def _values(x: Any) -> Any:
    """Step values -> their CPU values (step 1 only)."""
    def one(v: Any) -> Any:
        if isinstance(v, StepValue):
            if v._value is None:
                raise StepValueError("a step value without a CPU value while recording (csrun bug)")
            return v._value
        return v

    return pytree.tree_map(one, x)


@contextlib.contextmanager
def _shadow_run(model: torch.nn.Module) -> Iterator[None]:
    """Run the model once on the CPU for shapes only: its buffers and the RNG are restored afterwards."""
    with tensors_put_back(model), torch.random.fork_rng(devices=[]):
        yield


def value_of(x: Any) -> Any:
    """``x`` with every closed step value replaced by its device value (for closure arguments)."""
    def one(v: Any) -> Any:
        if isinstance(v, StepValue):
            return v._recorder._value_of(v)
        return v

    return pytree.tree_map(one, x)
