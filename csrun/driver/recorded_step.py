"""A recorded step: its calls and operations (:class:`Entry`), inputs, loss and kept values (:class:`Recording`).

The :class:`csrun.driver.step_recording.StepRecorder` makes a :class:`Recording` of a Session's
first step; the recording names the program's outputs, gives the step a stable signature (which
program runs it), and runs again, eagerly, on new inputs (:meth:`Recording.run`): the forward
``torch.export`` captures (:meth:`Recording.replay_forward`) and the first step's check against
eager (:mod:`csrun.driver.verify`).
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from csrun.compiler.errors import Location
from csrun.compiler.python_globals import Guard, values_set
from csrun.driver import autograd_calls, taps
from csrun.driver.taps import Tap
from csrun.driver.random_draws import Draw, Draws
from csrun.driver.step_templates import constants, describe, describe_call, fill, flatten_output, has_slots, ref_indices
from csrun.driver.step_values import StepValueError
from csrun.emulator.engine.update_split import UPDATE_MARKER


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
    autocast: str | None = None
    """The dtype of the script's ``torch.autocast("cpu", ...)`` around it (None: outside one): the
    program runs it under the same autocast (:func:`autocast_state`)."""
    guards: dict[tuple[int, str], Any] | None = None
    """A model call's Python values: those the script has assigned to the model's modules
    (:mod:`csrun.compiler.python_state`), as they were when the call was recorded."""
    mutable_guards: bool = False
    """Some of :attr:`guards` can change in place (a tensor, a list): compared at every call."""
    structure: int = 0
    """The model's structure version when the call was recorded (:class:`~csrun.compiler.python_state.PythonStateWatch`)."""
    hooks: tuple[int, ...] = ()
    """How many hooks each module had (:func:`csrun.driver.step_recording._hooks_of`)."""
    globals: tuple[Guard, ...] = ()
    """A model call's Python globals and closure variables its forward reads
    (:mod:`csrun.compiler.python_globals`), as they were when the call was recorded."""
    draws: tuple[Draw, ...] = ()
    """A model call's random draws, made on the host (:mod:`csrun.driver.random_draws`)."""
    draw_inputs: tuple[int, ...] | None = None
    """The program inputs holding them, in order (None: the device draws the call's random numbers)."""
    guard_names: tuple[str, ...] = ()
    """``path.attribute = value`` of each guard, for the signature and messages."""
    taps: tuple[Tap, ...] = ()
    """A model call's taps (:mod:`csrun.driver.taps`): their tensors follow its outputs in :attr:`results`."""

    def describe(self) -> str:
        """``name(args, keywords)`` as the user would recognise it."""
        name = "model" if self.func is None else getattr(self.func, "__name__", repr(self.func))
        at = f" at {self.location.filename}:{self.location.lineno}" if self.location else ""
        return f"{name}{describe_call(self.args, self.kwargs)}{at}"


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
                        and not has_slots((e.args, e.kwargs))):
                    dead.add(pos)
                    continue
                needed.update(ref_indices((e.args, e.kwargs)))
            self._optional = frozenset(dead)
        return self._optional

    def signature(self) -> str:
        """A stable text of the step (calls, operations, constants' digests, loss, kept values):
        which program runs it (computed once)."""
        if self._signature is not None:
            return self._signature
        lines = [f"inputs {describe_meta(tuple(self.inputs))}"]
        for e in self.entries:
            name = "model" if e.func is None else f"{getattr(e.func, '__module__', '')}.{getattr(e.func, '__qualname__', repr(e.func))}"
            how = (f"{' after update' if e.after_update else ''}{'' if e.grad else ' no_grad'}{describe_modes(e.modes)}"
                   f"{' autocast ' + e.autocast if e.autocast else ''}"
                   f"{f' structure {e.structure} hooks {sum(e.hooks)}' if e.func is None else ''}"
                   f"{' with ' + ', '.join(e.guard_names) if e.guard_names else ''}")
            lines.append(f"{name}{describe(tuple(e.args))}{describe(e.kwargs)} -> {list(e.results)}{how}")
        lines.append(f"loss {self.loss} kept {list(self.kept)}")
        consts = [c for e in self.entries for c in constants((e.args, e.kwargs))]
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
        :mod:`csrun.emulator.engine.update_split`)."""
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
            recorded_on: torch.nn.Module | None = None, autocast: str | None = None) -> dict[str, Any]:
        """Run the step's calls and operations on ``inputs`` (the program's inputs), eagerly:
        ``call_model(*args, **kwargs)`` runs the model's own forward, with ``model``'s modules in
        the modes and Python values of the recorded call (``recorded_on``: the model the step was
        recorded on, when ``model`` is a copy of it); results made under ``no_grad`` are
        detached; ``at_update(values)`` is called where ``optimizer.step()`` was, before the first
        value made after it (at the end when nothing came after it); ``autocast``: a dtype the
        calls the script made outside its own ``torch.autocast`` run under (the check's estimate of
        16-bit rounding). Returns the outputs by name (``loss``, ``v<i>``)."""
        modules = list(model.modules()) if model is not None else []
        originals = list(recorded_on.modules()) if recorded_on is not None else modules
        by_id = {id(o): m for o, m in zip(originals, modules)}
        env: dict[int, Any] = {}
        updated = False
        for e in self.entries:
            if e.after_update and not updated:
                at_update(env)
                updated = True
            args = fill(e.args, env.__getitem__, inputs)
            kwargs = fill(e.kwargs, env.__getitem__, inputs)
            with _autocast(e.autocast or autocast):
                if e.func is None:
                    drawn = Draws.replaying([inputs[i] for i in e.draw_inputs]) if e.draw_inputs is not None \
                        else contextlib.nullcontext()
                    with _modes_set(modules, e.modes), _values_set(by_id, e.guards), values_set(e.globals), \
                            drawn, autograd_calls.on_the_device(), taps.collecting() as found:
                        out = call_model(*args, **kwargs)
                    out = taps.with_taps(out, found) if e.taps else out
                else:
                    out = e.func(*args, **kwargs)
            leaves, _ = flatten_output(out)
            if not e.grad:
                leaves = [v.detach() if isinstance(v, torch.Tensor) else v for v in leaves]
            env.update(zip(e.results, leaves))
        if not updated:
            at_update(env)
        return {name: env[i] for i, name in self.output_names.items()}


def autocast_state() -> str | None:
    """The dtype of the ``torch.autocast("cpu", ...)`` the script is in (``bfloat16``), or None."""
    if not torch.is_autocast_enabled("cpu"):
        return None
    return str(torch.get_autocast_dtype("cpu")).removeprefix("torch.")


def _autocast(dtype: str | None) -> Any:
    """The recorded call's autocast: the script's dtype, or none (switched off if the replay is in one)."""
    if dtype is not None:
        return torch.autocast("cpu", dtype=getattr(torch, dtype))
    if torch.is_autocast_enabled("cpu"):
        return torch.autocast("cpu", enabled=False)
    return contextlib.nullcontext()


def describe_modes(modes: tuple[bool, ...] | None) -> str:
    """`` train``, `` eval`` or `` modes TTE`` of a model call's module modes (empty when not a model call)."""
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


def describe_meta(meta: tuple[tuple[torch.Size, torch.dtype], ...]) -> str:
    """``(2, 3) float32, (2,) int64`` of shapes and dtypes."""
    return ", ".join(f"{tuple(s)} {str(d).removeprefix('torch.')}" for s, d in meta)

