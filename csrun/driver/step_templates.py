"""Templates of a step's calls: arguments with step values replaced by references, and call outputs.

A recorded call keeps its arguments as a **template**: each device value becomes a :class:`Ref`
(its number in the step), each host value the device consumes a :class:`Slot` (the program's
input number), each other tensor a :class:`Const`; everything else stays as it was.
:func:`template` makes one, :func:`matches` checks a later step's live arguments against it (the
per-step check, kept lean), :func:`fill` turns it back into arguments for a replay, and
:func:`describe` into text for messages. :func:`flatten_output` takes a call's result apart into
its tensors and rebuilds it around new ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from csrun.compiler.errors import at
from csrun.compiler.locate import caller_location
from csrun.driver.step_values import StepValue, StepValueError

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

def _engine_value_used(value: "StepValue") -> StepValueError:
    return StepValueError(
        f"{at(caller_location())}the gradient norm exists only after the program's backward and clipping; pass it "
        "to a step closure (or capture it there) and compute with it there")

_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout,
            type(Ellipsis), torch.Size)


def template(x: Any) -> Any:
    """``x`` with device values -> :class:`Ref`, host values -> :class:`Slot` (consumed), other
    tensors -> :class:`Const`."""
    if isinstance(x, StepValue):
        if x._host:
            return Slot(x._recorder.consume_input(x))
        if x._ref < -1:
            raise _engine_value_used(x)
        return Ref(x._ref)
    if isinstance(x, torch.Tensor):
        return Const(x)
    if isinstance(x, _SCALARS):
        return x
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(template(v) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(template(v) for v in x)
    if isinstance(x, dict):
        return {k: template(v) for k, v in x.items()}
    if isinstance(x, slice):
        return slice(template(x.start), template(x.stop), template(x.step))
    return x


def matches(t: Any, x: Any) -> bool:
    """A live argument ``x`` matches the compiled template ``t`` (the per-step check, kept lean)."""
    if isinstance(x, StepValue):
        if x._host:
            return type(t) is Slot and t.index == x._recorder.consume_input(x)
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
            if not matches(a, b):
                return False
        return True
    if isinstance(x, dict):
        if t.keys() != x.keys():
            return False
        for k in x:
            if not matches(t[k], x[k]):
                return False
        return True
    if tx is slice:
        return matches(t.start, x.start) and matches(t.stop, x.stop) and matches(t.step, x.step)
    try:
        return bool(t == x)
    except Exception:  # an object without a usable ==: same only if identical
        return t is x


def fill(t: Any, env: Callable[[int], Any], slots: Sequence[Any] = ()) -> Any:
    """A template with each :class:`Ref` replaced by ``env(index)``, each :class:`Slot` by its
    input and constants by their tensors."""
    if isinstance(t, Ref):
        return env(t.index)
    if isinstance(t, Slot):
        return slots[t.index]
    if isinstance(t, Const):
        return t.tensor
    if isinstance(t, tuple) and hasattr(t, "_fields"):
        return type(t)(*(fill(v, env, slots) for v in t))
    if isinstance(t, (list, tuple)):
        return type(t)(fill(v, env, slots) for v in t)
    if isinstance(t, dict):
        return {k: fill(v, env, slots) for k, v in t.items()}
    if isinstance(t, slice):
        return slice(fill(t.start, env, slots), fill(t.stop, env, slots), fill(t.step, env, slots))
    return t


def numbers_differ(compiled: Any, live: Any) -> bool:
    """Whether a live call's arguments (:func:`sketch`) differ from the compiled template in Python
    numbers only (the same structure, values, inputs and constants otherwise)."""
    a, b = list(template_leaves(compiled)), list(template_leaves(live))
    if len(a) != len(b):
        return False
    numbers = (int, float)
    differ = False
    for x, y in zip(a, b):
        if isinstance(x, numbers) and isinstance(y, numbers) and not isinstance(x, bool) and not isinstance(y, bool):
            differ = differ or x != y
        elif type(x) is not type(y) or (isinstance(x, (Ref, Slot)) and x != y):
            return False
    return differ


def template_leaves(t: Any) -> Iterator[Any]:
    """Every leaf of a template (through tuples, lists, dicts and slices)."""
    if isinstance(t, (list, tuple)):
        for v in t:
            yield from template_leaves(v)
    elif isinstance(t, dict):
        for v in t.values():
            yield from template_leaves(v)
    elif isinstance(t, slice):
        yield from template_leaves((t.start, t.stop, t.step))
    else:
        yield t


def has_refs(t: Any) -> bool:
    """Whether a template holds a :class:`Ref` or :class:`Slot`."""
    return any(isinstance(x, (Ref, Slot)) for x in template_leaves(t))


def ref_indices(t: Any) -> Iterator[int]:
    """The value numbers a template reads."""
    return (x.index for x in template_leaves(t) if isinstance(x, Ref))


def has_slots(t: Any) -> bool:
    """Whether a template takes a host value (a program input)."""
    return any(isinstance(x, Slot) for x in template_leaves(t))


def constants(t: Any) -> Iterator[Const]:
    """Every :class:`Const` in a template."""
    return (x for x in template_leaves(t) if isinstance(x, Const))


def sketch(x: Any) -> Any:
    """Live arguments as a template for messages only (consumes nothing)."""
    if isinstance(x, StepValue):
        return Slot(x._slot if x._slot is not None else -1) if x._host else Ref(x._ref)
    if isinstance(x, torch.Tensor):
        return Const(x)
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        return type(x)(sketch(v) for v in x)
    if isinstance(x, dict):
        return {k: sketch(v) for k, v in x.items()}
    return x


def describe_call(args: Any, kwargs: Any) -> str:
    """``(a, b, k=v)`` of a call's templates."""
    inner = ", ".join([describe(v) for v in tuple(args)] + [f"{k}={describe(v)}" for k, v in (kwargs or {}).items()])
    return f"({inner})"


def describe(t: Any) -> str:
    """A template as the user would read it (``v3``, ``input0``, ``tensor(10,)``)."""
    if isinstance(t, Ref):
        return f"v{t.index}"
    if isinstance(t, Slot):
        return f"input{t.index}" if t.index >= 0 else "a batch value"
    if isinstance(t, Const):
        return f"tensor{tuple(t.tensor.shape)}"
    if isinstance(t, (list, tuple)):
        inner = ", ".join(describe(v) for v in t)
        return f"({inner})" if isinstance(t, tuple) else f"[{inner}]"
    if isinstance(t, dict):
        return "{" + ", ".join(f"{k}={describe(v)}" for k, v in t.items()) + "}"
    return repr(t)


# --------------------------------------------------------------------------------------------
# outputs of a call: any nesting of tensors in tuples, lists, dicts, dataclasses (ModelOutput)


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
        values, start = [], 0
        for (_, sub), n in zip(parts, sizes):
            values.append(sub(new[start:start + n]))
            start += n
        return make(values)

    return leaves, rebuild


# --------------------------------------------------------------------------------------------
# the recording
