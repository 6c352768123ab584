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
  constants, input shapes) and answered with new step values of the cached shapes, a small
  cost per operation (``bench/emulator/step_capture.py``; figures in BENCHMARKS.md).
* **A different step is refused.** A call or operation that differs from the compiled one
  (another branch taken, another loss, another shape), a missing or extra one, raises
  :class:`StepChanged` naming the user's file and line and what was compiled there. The
  system ran one compiled step per Session and refused a different one; so does csrun (each
  Session records its first step anew, so a new Session may run another step).

The pieces: :mod:`csrun.driver.step_values` (what a step value is, how it reads after the
boundary), :mod:`csrun.driver.step_templates` (a call's arguments as a template),
:mod:`csrun.driver.recorded_step` (the :class:`Recording`); this module is the recorder.
"""

from __future__ import annotations

import contextlib
import random
import sys
import weakref
from typing import Any, Callable, Iterator

import torch
import torch.nn.modules.module as module_hooks
import torch.utils._pytree as pytree

from csrun.compiler.capture import tensors_put_back
from csrun.compiler.errors import at
from csrun.compiler.locate import caller_location
from csrun.compiler import python_globals
from csrun.compiler.python_globals import GlobalReads
from csrun.compiler.python_state import PythonStateWatch, describe_change
from csrun.driver import autograd_calls, random_draws, taps
from csrun.driver.recorded_step import Entry, Recording, autocast_state, describe_meta, describe_modes
from csrun.driver.step_templates import (constants, describe_call, flatten_output, has_refs, matches, numbers_differ,
                                         ref_indices, sketch, template)
from csrun.driver.step_values import (DEVICE_MOVES, READS, StepChanged, StepState, StepValue, StepValueError, cpu_values,
                                      inside_closure, read_value)
from csrun.emulator.errors import READ_HINT, DeviceTensorReadError


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
        self._batch_leaves: dict[int, tuple[StepValue, int]] = {}
        """The step's batch tensors (kept alive, so ids stay theirs): id -> (value, leaf index)."""
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
        self._calling: torch.nn.Module | None = None
        """The model the current model call is on (its module names go in a refusal)."""
        self.predraw = True
        """The host makes the step's random draws (:mod:`csrun.driver.random_draws`); off on a
        cluster, whose systems draw their own."""

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

        self._batch_leaves = {}
        leaves, spec = pytree.tree_flatten(batch)
        for index, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor) and not isinstance(leaf, StepValue):
                leaves[index] = value = StepValue(self, step, -1, leaf.shape, leaf.dtype, leaf, host=True)
                self._batch_leaves[id(value)] = (value, index)
        return pytree.tree_unflatten(leaves, spec)

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
        step.input_leaves = tuple(self._batch_leaves[id(v)][1] if id(v) in self._batch_leaves else -1
                                  for v in self._slots)
        self._batch_leaves = {}
        step.open = False
        step.output_names = recording.output_names
        step.value_lines = recording.value_lines
        self._live = []
        self._slots = []
        return recording, step

    def consume_input(self, value: StepValue) -> int:
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
                                  "shapes changed: sizes must be static)", compiled=describe_meta((want,)),
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
        self._batch_leaves = {}
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
        self._calling = model
        args, kwargs = self._host_tensors(args, kwargs)
        if self._draft is None and (watch.version != self._guard_version or self._guarded_each_call(model)):
            self._check_guards(model, watch)
        entry: Entry | None
        if self._draft is not None:
            reads = GlobalReads()
            python_draws = _python_random_states()
            with _shadow_run(model, self.predraw) as drawn, torch.no_grad(), taps.collecting() as found, \
                    reads.watching():
                out = forward(*cpu_values(args), **cpu_values(kwargs))
            if _python_random_states() != python_draws:
                raise StepValueError(
                    f"{at(caller_location())}the model's forward draws Python random numbers (the random module or "
                    "numpy.random: a LayerDrop, a random branch): on the device its Python runs once, when the step is "
                    "compiled, so every step would take the first draw's branch; draw with torch instead "
                    "(torch.rand(()) < p, torch.bernoulli), whose draws the host makes for the device as eager does")
            result = self._record(None, args, kwargs, taps.with_taps(out, found), modes)
            recorded = self._draft.entries[-1]
            recorded.structure = watch.structure_version
            recorded.hooks = _hooks_of(self._module_list(model))
            if drawn is not None:
                recorded.draws = tuple(spec for spec, _ in drawn.made)
                recorded.draw_inputs = tuple(self._drawn_input(noise) for _, noise in drawn.made)
            recorded.guards = watch.guards()
            recorded.mutable_guards = any(not isinstance(v, (bool, int, float, str, bytes, type(None)))
                                          for v in recorded.guards.values())
            recorded.globals = reads.guards()
            recorded.guard_names = self._guard_names(model, recorded.guards) + \
                tuple(sorted(f"{g.describe()}={g.value!r}" for g in recorded.globals))
            recorded.taps = tuple(found)
            entry = recorded
            self._guard_version = watch.version
        else:
            result = self._check(None, args, kwargs, modes)
            entry = self.recording.entries[self._pos - 1] if self.recording is not None else None
            for spec in entry.draws if entry is not None else ():  # in program order, as eager's call draws
                self._drawn_input(random_draws.draw(spec))
        if entry is not None and entry.taps:  # csrun.driver.taps: the forward's metric updates
            result, tapped = result
            taps.queue_all(entry.taps, tapped)
        return result

    def _host_tensors(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        """A call's arguments with each plain tensor (not a step value: a class-weight tensor, a mask
        or a mixup coefficient the loop made) as a host value: an input of the step, taken anew
        every step as eager reads it. One computed with autograd (from the model's weights on the
        host: an L2 penalty) is refused: the device does not differentiate the host's computations."""
        step = self._step
        assert step is not None  # noqa: S101 - the step is open

        def host(x: Any) -> Any:
            if not isinstance(x, torch.Tensor) or isinstance(x, StepValue):
                return x
            if x.requires_grad:
                raise StepValueError(
                    f"{at(caller_location())}a tensor computed with autograd on the host (from the model's weights: "
                    "an L2 or orthogonality penalty, a parameter itself) is used in the step: the device "
                    "differentiates the step's program, not the host's copies of the weights; compute it inside the "
                    "model's forward (and return it with the output), or use weight_decay")
            copy = x.detach().clone()  # the script may change its tensor while the device runs the step
            return StepValue(self, step, -1, copy.shape, copy.dtype, copy, host=True)

        if not any(isinstance(x, torch.Tensor) and not isinstance(x, StepValue) for x in pytree.tree_leaves((args, kwargs))):
            return args, kwargs
        return pytree.tree_map(host, (args, kwargs))

    def _drawn_input(self, noise: torch.Tensor) -> int:
        """A model call's random draw, made on the host: the step's next input."""
        assert self._step is not None  # noqa: S101 - the step is open
        return self.consume_input(StepValue(self, self._step, -1, noise.shape, noise.dtype, noise, host=True))

    def _watch(self, model: torch.nn.Module) -> PythonStateWatch:
        if self.watch is None:
            self.watch = PythonStateWatch(model)
        return self.watch

    def _guarded_each_call(self, model: torch.nn.Module) -> bool:
        """Whether the compiled call at this position depends on something its script may change
        without an assignment the watch hears (a global, a value changed in place, a hook)."""
        recording = self.recording
        if recording is None or self._pos >= len(recording.entries):
            return False
        entry = recording.entries[self._pos]
        return bool(entry.globals) or entry.mutable_guards or _hooks_of(self._module_list(model)) != entry.hooks

    def _check_guards(self, model: torch.nn.Module, watch: PythonStateWatch) -> None:
        """Before a model call of a later step: the Python values the script assigned since the
        step was recorded, and the globals the forward reads, must be those of the recorded call
        here. A changed one recompiles the step (one notice naming the line that changed it, or
        the global), or, in the middle of a step, is refused."""
        recording = self.recording
        self._guard_version = watch.version
        if recording is None or self._pos >= len(recording.entries):
            return
        entry = recording.entries[self._pos]
        if entry.func is not None or entry.guards is None:
            return
        found = self._what_changed(model, watch, entry)
        if found is None:
            return
        what, line = found
        if self._pos != 0:
            raise StepChanged(f"a Python value the model reads changed within the step ({what})",
                              compiled=entry.describe(), location=caller_location())
        if line not in self._noticed:  # once per line; each change recompiles
            self._noticed.add(line)
            self.notice(f"{what}: the step depends on it, so it is compiled again (the device runs the step it "
                        "compiled; a value that changes every step recompiles every step)")
        self.recording = None
        self._draft = Recording()

    def _what_changed(self, model: torch.nn.Module, watch: PythonStateWatch, entry: Entry) -> tuple[str, str] | None:
        """What the model call at ``entry`` depends on that changed since it was recorded (its
        description and the key its notice is given once for), or None."""
        if watch.structure_version != entry.structure and watch.last_structure_change is not None:
            replaced = watch.last_structure_change
            what = describe_change(replaced, model).replace(" changed (", " was replaced (")
            return what, f"{replaced.location.filename}:{replaced.location.lineno}" if replaced.location else what
        if _hooks_of(self._module_list(model)) != entry.hooks:
            return "a hook on the model was added or removed", "hooks"
        change = watch.changed_since(entry.guards or {})
        if change is not None:
            what = describe_change(change, model)
            return what, f"{change.location.filename}:{change.location.lineno}" if change.location else what
        moved = python_globals.changed(entry.globals)
        if moved is not None:
            return (f"the Python {moved.kind} {moved.describe()} changed ({python_globals.short(moved.value)} -> "
                    f"{python_globals.short(moved.current())})", moved.describe())
        return None

    def _module_list(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        modules = self._modules.get(id(model))
        if modules is None:
            modules = self._modules[id(model)] = list(model.modules())
        return modules

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
            _plain_backward(func, args, kwargs)
            return self._backward(first)
        if func is autograd_calls.ORIGINAL_GRAD:
            raise autograd_calls.NestedGradient(f"{at(caller_location())}torch.autograd.grad on the step's values "
                                                f"(a gradient penalty): {autograd_calls.NESTED_FIX}")
        if not device:
            return self._on_host(func, name, args, kwargs)
        if name in READS:
            raise DeviceTensorReadError(f"{at(caller_location())}cannot {READS[name]} a device tensor here: {READ_HINT}")
        if name in DEVICE_MOVES and _is_device_move(args, kwargs):
            return args[0]
        planned = random_draws.plan_draw(func, args, kwargs) if self.predraw and random_draws.maybe_random(func) else None
        if planned is not None:  # a draw on the step's values' shapes: made here, in program order
            spec, result_of = planned
            noise = random_draws.draw(spec)
            return result_of(StepValue(self, step, -1, noise.shape, noise.dtype, noise, host=True))
        args, kwargs = self._host_tensors(args, kwargs)
        if self._draft is not None:
            with torch.no_grad():
                out = func(*cpu_values(args), **cpu_values(kwargs))
            result = self._record(func, args, kwargs, out)
        else:
            result = self._check(func, args, kwargs)
        if name.endswith("_") and not name.endswith("__") and isinstance(args[0], StepValue) and isinstance(result, StepValue):
            args[0]._ref = result._ref  # in place: the variable now names the result
            args[0]._value = result._value
            return args[0]
        return result

    # -- internals ----------------------------------------------------------------------------

    def _on_host(self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Operations on the batch alone run here, on the chief, every step (not recorded): their
        tensor results stay host values, so the device takes them as inputs where it needs them.
        One that writes into a value the device already took (``x.add_(0.5)`` between two model
        calls) leaves that input as the earlier call saw it: the next call takes the new value as
        an input of its own, as eager's calls each see theirs."""
        step = self._step
        assert step is not None  # noqa: S101 - the step is open
        if name == "requires_grad_" and (args[1] if len(args) > 1 else kwargs.get("requires_grad", True)):
            raise StepValueError(
                f"{at(caller_location())}requires_grad_() on the batch: gradients with respect to the inputs (an "
                "adversarial example, FGSM, a saliency map) are not computed by the device, which differentiates "
                "the step for its weights; compute them in a CPU run (csrun_cpu), or inside the model's forward")
        taken = self._inputs_written(name, args, kwargs) if self._slots else []
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*cpu_values(args), **cpu_values(kwargs))
        for index, value, before in taken:
            if not torch.equal(value._value, before):  # type: ignore[arg-type]  # a host value has one
                self._keep_input(index, value, before)

        def wrap(t: Any) -> Any:
            if isinstance(t, torch.Tensor) and not isinstance(t, StepValue):
                return StepValue(self, step, -1, t.shape, t.dtype, t, host=True)
            return t

        return pytree.tree_map(wrap, out) if isinstance(out, (torch.Tensor, tuple, list)) else out

    def _inputs_written(self, name: str, args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> list[tuple[int, StepValue, torch.Tensor]]:
        """The inputs already taken that an operation may write into (in place, ``out=``,
        assignment), each with a copy of its value: (input number, value, copy)."""
        if not (name in _WRITES or (name.endswith("_") and not name.endswith("__")) or "out" in kwargs):
            return []
        targets = [args[0]] if args else []
        targets += pytree.tree_leaves(kwargs.get("out"))
        storages = {cpu_values(t).untyped_storage().data_ptr() for t in targets if isinstance(t, torch.Tensor)}
        return [(index, v, v._value.clone()) for index, v in enumerate(self._slots)  # type: ignore[union-attr]
                if v._value is not None and v._value.untyped_storage().data_ptr() in storages]

    def _keep_input(self, index: int, value: StepValue, before: torch.Tensor) -> None:
        """Input ``index`` keeps ``before`` (what the device took); ``value``, written since, is a
        host value the next use takes as a new input."""
        assert self._step is not None  # noqa: S101 - the step is open
        kept = StepValue(self, self._step, -1, before.shape, before.dtype, before, host=True)
        kept._slot = index
        self._slots[index] = kept
        leaf = self._batch_leaves.pop(id(value), None)
        if leaf is not None:  # the input is the batch's leaf as it came; the written value is not any more
            self._batch_leaves[id(kept)] = (kept, leaf[1])
        value._slot = None

    def _require_open(self, what: str) -> None:
        if not self.step_open:
            raise StepValueError(f"{what} was called outside a step: on the system the model runs on the batches "
                                 "the Session's dataloader hands out (for batch in dataloader: ...)")

    def _backward(self, loss: StepValue) -> None:
        if self._draft is not None and self._draft.loss is not None:
            raise StepValueError(f"{at(caller_location())}backward() was called twice in one step; the system runs one "
                                 "backward per step (add the losses and call backward() once)")
        if self._on_backward is not None:
            self._on_backward()
        if loss.numel() != 1 or not loss.dtype.is_floating_point:
            raise StepValueError(f"{at(caller_location())}backward() on a {tuple(loss.shape)} {loss.dtype} value: the loss "
                                 "must be a scalar float (reduce it, e.g. loss.mean())")
        if self._draft is not None:
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
        targs, kw = template(args), template(kwargs)
        late = self._after_update if func is None else any(i in self._late for i in ref_indices((targs, kw)))
        entry = Entry(func=func, args=targs, kwargs=kw, results=tuple(results),
                      result_meta=tuple(meta), rebuild=rebuild, location=loc, plain_kwargs=not any(constants(kw))
                      and not has_refs(kw), after_update=late, grad=torch.is_grad_enabled(), modes=modes,
                      autocast=autocast_state())
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
                or entry.modes != modes or entry.autocast != autocast_state():
            raise StepChanged(_how_it_differs(entry, self._after_update, modes,
                                              [n for n, _ in self._calling.named_modules()] if self._calling else []), compiled=entry.describe(),
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
        live = (sketch(tuple(args)), sketch(kwargs))
        numbers = first.func is func and numbers_differ((tuple(first.args), first.kwargs), live)
        hint = (" (a Python number that changes from step to step: pass it as a tensor, torch.tensor(x), which the "
                "device takes as an input of each step)") if numbers else ""
        raise StepChanged(f"{name}{describe_call(*live)}{hint}", compiled=first.describe(), location=caller_location())

    def _closed(self, step: StepState, func: Any, name: str,
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not inside_closure():
            raise DeviceTensorReadError(f"cannot use {name or 'an operation'} on a device tensor of step {step.number} "
                                        f"here: {READ_HINT}")
        real = pytree.tree_map(lambda x: read_value(x) if isinstance(x, StepValue) else x, (args, kwargs))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*real[0], **real[1])

    def _closed_host(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            return func(*cpu_values(args), **cpu_values(kwargs))


_WRITES = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                     "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__"})
"""Tensor methods that write into their tensor besides the ``*_`` ones."""


_BACKWARD_EXTRAS = {"gradient": 1, "grad_tensors": 1, "grad_variables": 4, "inputs": 5}
"""``backward``'s arguments the device's one backward from the loss cannot honour, by position
(``Tensor.backward(gradient, retain_graph, create_graph, inputs)``; ``torch.autograd.backward``
takes ``(tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs)``)."""


def _python_random_states() -> tuple[Any, ...]:
    """The state of Python's and NumPy's global random generators (a forward that draws from them
    moves them)."""
    numpy = sys.modules.get("numpy")
    return random.getstate(), (numpy.random.get_state()[1].tobytes() if numpy is not None else None)


def _hooks_of(modules: list[torch.nn.Module]) -> tuple[int, ...]:
    """How many forward and backward hooks each module has, and the global ones (a hook added or
    removed between steps changes what the forward computes)."""
    counts = [len(h) for m in modules for h in (m._forward_pre_hooks, m._forward_hooks, m._backward_hooks,
                                                 m._backward_pre_hooks)]
    counts += [len(module_hooks._global_forward_pre_hooks), len(module_hooks._global_forward_hooks)]
    return tuple(counts)


def _plain_backward(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a ``backward`` that is not the loss's plain one: several losses, a gradient to start
    from, ``inputs=``, ``create_graph=True`` (each would differentiate something else)."""
    method = func is torch.Tensor.backward or getattr(func, "__qualname__", "") == "Tensor.backward"
    first = args[0] if args else kwargs.get("tensors")
    given = {k: v for k, v in kwargs.items() if v is not None and k not in ("retain_graph", "tensors")}
    positional = args[1:] if method else args[1:]
    names = ("gradient", "retain_graph", "create_graph", "inputs") if method else \
        ("grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs")
    given.update({n: v for n, v in zip(names, positional) if v is not None and n != "retain_graph"})
    if given.get("create_graph") is False:
        given.pop("create_graph")
    what = ""
    if isinstance(first, (list, tuple)) and len(first) != 1:
        what = f"{len(first)} losses at once"
    elif given:
        what = ", ".join(f"{k}=..." for k in given)
    if what:
        raise StepValueError(f"{at(caller_location())}backward with {what}: the device runs one backward per step, "
                             "from the loss with a gradient of 1; write it as one loss (add the losses, multiply the "
                             "loss by its weight: (l1 + w * l2).backward())")


def _same_call(entry: Entry, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a live call is the compiled ``entry`` (function, arguments' structure and constants)."""
    return entry.func is func and matches(entry.args, args) and (
        entry.kwargs == kwargs if entry.plain_kwargs else matches(entry.kwargs, kwargs))


def _how_it_differs(entry: Entry, after_update: bool, modes: tuple[bool, ...] | None, names: list[str]) -> str:
    """What differs between a call and the compiled one at its place: update, grad mode or module modes."""
    if entry.after_update != after_update:
        return ("this runs after optimizer.step(), on the updated weights" if after_update
                else "this runs before optimizer.step() (or in a step without it)")
    if entry.grad != torch.is_grad_enabled():
        return "this runs with grad mode " + ("on" if torch.is_grad_enabled() else "off (torch.no_grad())")
    if entry.autocast != autocast_state():
        now = autocast_state()
        return f"this runs under torch.autocast(dtype={now})" if now else "this runs outside torch.autocast"
    changed = [(name, now) for name, now, then in zip(names, modes or (), entry.modes or ()) if now != then]
    if changed and len(names) == len(modes or ()):
        shown = ", ".join(f"model{'.' + n if n else ''} in {'train' if now else 'eval'} mode" for n, now in changed[:3])
        return f"{shown}{' and more' if len(changed) > 3 else ''} (the mode each module had when it was compiled differs)"
    return f"the model is called in{describe_modes(modes)} mode"


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


def _is_device_move(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``x.to(device)`` / ``x.cuda()`` / ``x.cpu()`` without a dtype change."""
    rest = list(args[1:]) + list(kwargs.values())
    return all(isinstance(a, (torch.device, str, int, bool, type(None))) for a in rest) and \
        not any(isinstance(a, torch.dtype) for a in rest)


@contextlib.contextmanager
def _shadow_run(model: torch.nn.Module, predraw: bool) -> Iterator[random_draws.Draws | None]:
    """Run the model once on the CPU, for shapes: its buffers are restored afterwards. Its random
    draws: with ``predraw``, those the host makes are the step's (:mod:`csrun.driver.random_draws`,
    yielded) and the rest leave the generator as it was; else the whole generator is restored."""
    with tensors_put_back(model), autograd_calls.on_the_device():
        if predraw:
            with random_draws.Draws.recording() as drawn:
                yield drawn
        else:
            with torch.random.fork_rng(devices=[]):
                yield None
