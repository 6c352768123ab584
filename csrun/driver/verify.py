"""The device checks itself against eager PyTorch: the first steps of every program, and a sample later.

Whatever csrun missed in a script, the numbers show it. For each checked step the driver fetches
the device's state before the step, runs the step on the device (asking it to hand back the
gradients its update applied), fetches the state after it, and runs the same step eagerly on the
CPU from the state before (:class:`StepCheck`): a copy of the user's model and of the user's
torch optimizer (its class, its groups, the hyperparameters the script's groups held at
``optimizer.step()``), the step's calls and operations as the script made them (the recording,
with each call's module modes, grad and autocast context, Python values and random draws),
``loss.backward()``, the step's clipping, and the script's own optimizer.

It compares what rounding cannot amplify, in this order, and stops the run with
:class:`DeviceDiffers` at the first value that differs by more than the precision allows,
naming the value, the tensor and the user's line that made it:

1. **the outputs**: the loss, every value the step hands back (what closures read), the gradient
   norm clipping returned (:data:`TOLERANCES`: the largest difference against
   ``absolute + relative * largest magnitude``);
2. **the gradients** the update applied (unscaled and clipped), each against eager's, relative to
   its largest magnitude with the step's largest gradient as a floor (:data:`GRADIENT_FLOOR`): a
   gradient that is zero in exact arithmetic (an attention key's bias) is rounding noise on both
   sides, and is not compared with its own noise; in a 16-bit program a gradient beyond that also
   passes when it is within :data:`NOISE_FACTOR` times as far from eager's float32 gradient as
   the same step replayed under ``torch.autocast`` at the precision is (this step's own
   rounding: late in a run the gradients shrink and rounding is a larger part of them);
3. **the update**, recomputed eagerly from the device's own gradients by the script's optimizer:
   the weights' change and the optimizer state after the step, tightly (:data:`UPDATE_TOLERANCE`:
   the same gradients give the same update, whatever the precision, so Adam's division by a tiny
   second moment cannot turn rounding into an lr-sized difference), then the buffers the forward
   changed (BatchNorm's statistics) within the precision;
4. **the optimizer's groups and state**: each hyperparameter of the device's groups against the
   script's group at ``optimizer.step()``, and each weight's set of optimizer-state keys against
   eager's (``momentum_buffer``, ``exp_avg``, ``max_exp_avg_sq`` ...).

The eager replay runs the user's Python again, on copies: the model is a deep copy, the Python
values it reads are set to the recorded ones and put back, its random draws are the step's own
inputs, and what it prints is held back. A step whose update skipped (a loss-scaling overflow)
is compared up to its outputs; a step that draws random numbers the device draws itself (not
eager's: :mod:`csrun.driver.random_draws`) is checked only on the in-process CPU emulator; a step
that updates gradients earlier steps accumulated, or whose model cannot be copied or run again
eagerly, is not checked (a notice says why; the run goes on).

Which steps (:class:`Verifier`): the first ``--verify_steps N`` of every program compiled
(``cbtorch.initialize(verify_steps=N)``, else ``CSRUN_VERIFY_STEPS``, default 1; 0: off), and
one every ``--verify_every K`` steps later (``CSRUN_VERIFY_EVERY``, default 0: none).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import io
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from csrun.compiler.errors import Location, at
from csrun.driver import legacy_state
from csrun.driver.clipping import NORM, VALUE, torch_clipping
from csrun.driver.coherence.hyperparameters import HyperparameterValue
from csrun.driver.options import VERIFY_ENV
from csrun.driver.recorded_step import Recording
from csrun.emulator.engine.executor import GRADIENT_PREFIX
from csrun.program.clipping import clip_gradients
from csrun.program.step_plan import StepPlan
from csrun.errors import UserError
from csrun.program.schedules import build_schedule

log = logging.getLogger("csrun.driver")

TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-5, 1e-6),
    "float16": (2e-2, 2e-3),
    "bfloat16": (6e-2, 6e-3),
    "cbfloat16": (6e-2, 6e-3),
}
"""Precision -> (relative, absolute): a value the step computed (an output, a gradient, a buffer)
differs when its largest difference exceeds ``absolute + relative * (its largest magnitude in eager)``."""

NOISE_FACTOR = 8.0
"""In a 16-bit program a gradient also passes when its distance (2-norm) from eager's float32 one
is within this many times the distance of eager's own 16-bit gradient (the same step replayed
under ``torch.autocast`` at the precision) from it: the rounding this step, at this point of
training, makes of it. A wrong gradient is as far as the gradient is long."""

HALF_DTYPES = {"float16": "float16", "bfloat16": "bfloat16", "cbfloat16": "bfloat16"}
"""The 16-bit precisions, with the autocast dtype their rounding is estimated at."""

GRADIENT_FLOOR = 0.1
"""A gradient's magnitude for its tolerance is at least this part of the step's largest gradient
magnitude: a weight whose gradient is zero in exact arithmetic gets rounding noise on both sides."""

UPDATE_TOLERANCE = 1e-4
"""The update recomputed from the device's own gradients: a weight differs when
``|device - eager| > UPDATE_TOLERANCE * |its change| + ROUNDING * |its value|`` (norms over the
tensor); an optimizer state tensor when its largest difference exceeds ``UPDATE_TOLERANCE``
times its largest magnitude (plus ``ROUNDING``)."""

ROUNDING = 1e-7
"""A weight's own float32 rounding, relative to its norm."""

_OPTIMIZER_OVERRIDES = ("step", "zero_grad", "state_dict", "load_state_dict", "add_param_group",
                        "_csrun_scheduler_watch", "_cstorch_lr_scheduler", "_opt_called")
"""Instance attributes csrun (or a scheduler) put on the user's optimizer; its copy goes without them."""


class DeviceDiffers(UserError):
    """A verified step gave other numbers on the device than in eager PyTorch."""


def draws_random(program: torch.export.ExportedProgram | None) -> bool:
    """Whether the program draws random numbers itself (draws the host could not make for it)."""
    if program is None:
        return False
    for node in program.graph.nodes:
        tags = getattr(node.target, "tags", ()) if node.op == "call_function" else ()
        if torch.Tag.nondeterministic_seeded in tags:
            return True
    return False


@dataclass(kw_only=True)
class StepFacts:
    """What the driver knows about the step being checked."""

    number: int
    """The step's number in the run (for the report)."""
    mode: str
    recording: Recording
    inputs: tuple[torch.Tensor, ...]
    plan: StepPlan
    precision: str
    learning_rates: list[float] | None
    """Each group's ``lr`` when the script called ``optimizer.step()`` (None: not called)."""
    schedule: Any
    """The compile settings' ``learning_rate`` when it drives every group (else None)."""
    settings_clip: tuple[float | None, float | None]
    """The compile settings' (max_gradient_norm, max_gradient_value)."""
    stepped_at: Location | None
    """Where the script called ``optimizer.step()``."""
    group_values: list[dict[str, HyperparameterValue]] = field(default_factory=list)
    """The script's param groups' hyperparameters at ``optimizer.step()`` (empty: not known)."""


@dataclass
class _Mismatch:
    what: str
    difference: float
    allowed: float
    location: Location | None


@dataclass
class _Eager:
    """What the eager replay gave."""

    outputs: dict[str, Any]
    gradients: dict[str, torch.Tensor] = field(default_factory=dict)
    """The gradients eager's update would apply (after clipping), by weight name."""
    model: torch.nn.Module | None = None
    """The eager copy after the step: its update recomputed from the device's gradients."""
    optimizer: torch.optim.Optimizer | None = None
    updated: bool = False
    """The update was recomputed (the device handed back its gradients and did not skip)."""
    rounding: dict[str, float] = field(default_factory=dict)
    """In a 16-bit program: each gradient's 2-norm distance between eager's 16-bit replay and its
    float32 one (:data:`NOISE_FACTOR`); empty otherwise, or when that replay failed."""


class StepCheck:
    """One verified step: the device's state before it, then :meth:`finish` after it ran."""

    def __init__(self, facts: StepFacts, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                 before: Mapping[str, Any], view: Any) -> None:
        """``before``: the device's state before the step (``Device.state_dict()``); ``view``:
        the state view the user's modules point at (the copies must not)."""
        self.facts = facts
        self.model = model
        self.optimizer = optimizer
        self.before = before
        self.view = view
        self.rng = torch.random.get_rng_state()

    def finish(self, outputs: Mapping[str, torch.Tensor], after: Mapping[str, Any]) -> bool:
        """Run the step eagerly from the state before and compare (raises :class:`DeviceDiffers`);
        False when the eager run failed (a notice says so: the run goes on unchecked)."""
        device_rng = torch.random.get_rng_state()
        torch.random.set_rng_state(self.rng)
        device_grads = {k.removeprefix(GRADIENT_PREFIX): v for k, v in outputs.items() if k.startswith(GRADIENT_PREFIX)}
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                eager = self._eager(after, device_grads)
        except Exception as exc:  # noqa: BLE001 - a model that cannot be copied or rerun: the run goes on unchecked
            log.warning("step %d is not checked against eager PyTorch: its eager run failed (%s: %s)",
                        self.facts.number, type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "")
            return False
        finally:
            torch.random.set_rng_state(device_rng)
        mismatch = (self._compare_outputs(outputs, eager.outputs) or self._compare_gradients(device_grads, eager)
                    or self._compare_update(after, eager) or self._compare_groups(after, eager))
        if mismatch is not None:
            self._report(mismatch)
        return True

    # -- the eager step --------------------------------------------------------------------------

    def _eager(self, after: Mapping[str, Any], device_grads: Mapping[str, torch.Tensor]) -> _Eager:
        facts = self.facts
        ref_model, ref_opt = self._copies()
        state = legacy_state.from_device(self.before, self.model, self.optimizer)
        ref_model.load_state_dict(state["model"], strict=False)
        fresh = state.get("global_step", 0) == 0 and self.optimizer is not None and not self.optimizer.state
        if ref_opt is not None and state.get("optimizer") and not fresh:  # the run's first update: torch's own start
            ref_opt.load_state_dict(state["optimizer"])
        forward = type(ref_model).forward.__get__(ref_model)
        result = _Eager(outputs={}, model=ref_model, optimizer=ref_opt)
        skipped = _skipped(self.before, after) if facts.plan.update else False
        params = dict(ref_model.named_parameters())

        def update(values: dict[int, Any]) -> None:
            if facts.mode != "train" or not facts.plan.backward or facts.recording.loss is None:
                return
            values[facts.recording.loss].backward()
            if not facts.plan.update or ref_opt is None:
                return
            norm = self._clip(ref_model)
            if norm is not None:
                result.outputs["grad_norm"] = norm
            result.gradients = {n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None}
            if skipped or not device_grads:
                return
            for name, p in params.items():  # the update from the device's own gradients
                given = device_grads.get(name)
                p.grad = given.to(p.dtype).clone() if given is not None else None
            self._set_learning_rates(ref_opt, state.get("global_step", 0))
            ref_opt.step()
            result.updated = True

        context = torch.enable_grad() if facts.mode == "train" else torch.no_grad()
        with context:
            outputs = facts.recording.run(forward, ref_model, list(facts.inputs), at_update=update,
                                          recorded_on=self.model)
        result.outputs = {**outputs, **result.outputs}
        if result.gradients and facts.precision in HALF_DTYPES:
            result.rounding = self._rounding(state, result.gradients)
        return result

    def _rounding(self, state: Mapping[str, Any], gradients: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """How far 16-bit rounding moves each gradient of this step: the step replayed on another
        copy under ``torch.autocast`` at the precision, against the float32 replay (2-norms); empty
        when that replay fails (the fixed tolerance alone decides)."""
        facts = self.facts
        model, _ = self._copies()
        model.load_state_dict(state["model"], strict=False)
        params = dict(model.named_parameters())
        found: dict[str, float] = {}

        def backward(values: dict[int, Any]) -> None:
            if facts.recording.loss is None:
                return
            values[facts.recording.loss].float().backward()
            self._clip(model)
            for name, p in params.items():
                want = gradients.get(name)
                if p.grad is not None and want is not None:
                    found[name] = float(torch.linalg.vector_norm(p.grad.float() - want.float()))

        torch.random.set_rng_state(self.rng)
        try:
            with torch.enable_grad():
                facts.recording.run(type(model).forward.__get__(model), model, list(facts.inputs), at_update=backward,
                                    recorded_on=self.model, autocast=HALF_DTYPES[facts.precision])
        except Exception:  # noqa: BLE001 - an op without a 16-bit CPU kernel: no estimate
            return {}
        return found

    def _copies(self) -> tuple[torch.nn.Module, torch.optim.Optimizer | None]:
        """Copies of the user's model and optimizer that know nothing of csrun (the optimizer's
        groups with the hyperparameters the script's held at ``optimizer.step()``)."""
        for name, module in self.model.named_modules():
            bound = [k for k, v in module.__dict__.items() if callable(v) and not isinstance(v, (torch.nn.Module, type))
                     and not getattr(v, "_csrun_routed", False)]
            if bound:  # a copy would keep calling the original (a method bound to it, a closure over it)
                raise RuntimeError(f"the module {name or 'model'} has {bound[0]!r} as an instance attribute, which a "
                                   "copy of the model cannot run on the copy")
        ref_model = copy.deepcopy(self.model)  # a plain module of the user's classes (csrun.driver.state_view)
        if self.optimizer is None:
            return ref_model, None
        mapping = {id(p): q for p, q in zip(self.model.parameters(), ref_model.parameters())}
        ref_opt = object.__new__(type(self.optimizer))
        ref_opt.__dict__.update({k: v for k, v in self.optimizer.__dict__.items() if k not in _OPTIMIZER_OVERRIDES})
        ref_opt.defaults = dict(self.optimizer.defaults)
        ref_opt.param_groups = [{**{k: copy.deepcopy(v) for k, v in g.items() if k != "params"},
                                 "params": [mapping[id(p)] for p in g["params"]]} for g in self.optimizer.param_groups]
        for group, values in zip(ref_opt.param_groups, self.facts.group_values):
            for key, value in values.items():
                if key != "lr" and key in group and not isinstance(group[key], torch.Tensor):
                    group[key] = value
        ref_opt.state = collections.defaultdict(dict)
        for key, value in list(ref_opt.__dict__.items()):
            if key.endswith("_hooks") and isinstance(value, dict):
                setattr(ref_opt, key, collections.OrderedDict())  # the script's hooks are not the check's
        return ref_model, ref_opt

    def _clip(self, model: torch.nn.Module) -> torch.Tensor | None:
        """The step's clipping on the eager gradients: torch's own ``clip_grad_norm_`` /
        ``clip_grad_value_`` as the script called them, or the compile settings' as the CPU path
        applies them."""
        plan = self.facts.plan
        params = [p for p in model.parameters() if p.requires_grad]
        if plan.max_gradient_norm is not None:
            return torch_clipping(NORM)(params, plan.max_gradient_norm, plan.gradient_norm_type)
        if plan.max_gradient_value is not None:
            torch_clipping(VALUE)(params, plan.max_gradient_value)
            return None
        grads = [p.grad for p in params if p.grad is not None]
        max_norm, max_value = self.facts.settings_clip
        if max_norm or max_value:
            with torch.no_grad():
                clip_gradients(grads, max_norm=max_norm, max_value=max_value)
        return None

    def _set_learning_rates(self, optimizer: torch.optim.Optimizer, global_step: int) -> None:
        facts = self.facts
        if facts.schedule is not None:
            rates = [float(build_schedule(facts.schedule)(int(global_step)))] * len(optimizer.param_groups)
        elif facts.learning_rates is not None:
            rates = list(facts.learning_rates)
        else:
            return
        for g, rate in zip(optimizer.param_groups, rates):
            if isinstance(g["lr"], torch.Tensor):
                g["lr"].fill_(rate)
            else:
                g["lr"] = rate

    # -- comparing -------------------------------------------------------------------------------

    def _tolerance(self) -> tuple[float, float]:
        return TOLERANCES.get(self.facts.precision, TOLERANCES["float32"])

    def _compare_outputs(self, device: Mapping[str, torch.Tensor], eager: Mapping[str, Any]) -> _Mismatch | None:
        recording = self.facts.recording
        line_of = {name: recording.value_lines.get(ref) for ref, name in recording.output_names.items()}
        for name in ["loss", *sorted(k for k in eager if k != "loss")]:
            if name not in eager or name not in device or not isinstance(eager[name], torch.Tensor):
                continue
            what = "the loss" if name == "loss" else (
                "the gradient norm clip_grad_norm_ returned" if name == "grad_norm" else "a value the step hands back")
            found = self._differs(what, device[name], eager[name], line_of.get(name) or self.facts.stepped_at)
            if found is not None:
                return found
        return None

    def _compare_gradients(self, device: Mapping[str, torch.Tensor], eager: _Eager) -> _Mismatch | None:
        """The gradients the device's update applied against eager's (a zero-expectation one against
        the step's largest gradient: :data:`GRADIENT_FLOOR`)."""
        if not device or not eager.gradients:
            return None
        floor = GRADIENT_FLOOR * max((float(g.detach().abs().max()) for g in eager.gradients.values() if g.numel()),
                                     default=0.0)
        for name, got in device.items():
            want = eager.gradients.get(name)
            if want is None:
                want = torch.zeros_like(got)  # eager holds none: a zero_grad(set_to_none=False) zero
            found = self._differs(f"the gradient of '{name}' the update applied", got, want, self.facts.stepped_at,
                                  floor=floor, tolerance=(self._tolerance()[0], 1e-12))
            if found is not None and name in eager.rounding:
                distance = float(torch.linalg.vector_norm(got.float() - want.float()))
                allowed = NOISE_FACTOR * eager.rounding[name]
                if distance <= allowed:
                    continue  # this step's 16-bit rounding moves it as far
                found = _Mismatch(f"the gradient of '{name}' the update applied (2-norm of the difference)", distance,
                                  allowed, self.facts.stepped_at)
            if found is not None:
                return found
        missing = sorted(set(eager.gradients) - set(device))
        if missing:
            return _Mismatch(f"the gradients: eager PyTorch updates '{missing[0]}', the device has no gradient for it",
                             math.inf, 0.0, self.facts.stepped_at)
        return None

    def _compare_update(self, after: Mapping[str, Any], eager: _Eager) -> _Mismatch | None:
        """The weights and optimizer state after the step against the update recomputed from the
        device's gradients (tightly), and the buffers against eager's (within the precision)."""
        if self.facts.mode != "train" or eager.model is None:
            return None
        device = legacy_state.from_device(after, self.model, self.optimizer)
        before = legacy_state.from_device(self.before, self.model, self.optimizer)["model"]
        first_call = next((e.location for e in self.facts.recording.entries if e.func is None), None)
        buffers = {n for n, _ in self.model.named_buffers()}
        for name, want in eager.model.state_dict().items():
            got, was = device["model"].get(name), before.get(name)
            if got is None or was is None:
                continue
            if name in buffers:
                found = self._differs(f"the buffer '{name}' after the step", got, want, first_call)
            elif eager.updated:
                found = self._change_differs(f"the weight '{name}': its update in the step", got, want, was,
                                             self.facts.stepped_at)
            else:
                continue
            if found is not None:
                return found
        if not eager.updated or eager.optimizer is None:
            return None
        names = legacy_state.param_order(self.model, self.optimizer) or []
        got_state = device.get("optimizer", {}).get("state", {})
        for index, slots in eager.optimizer.state_dict().get("state", {}).items():
            label = names[index] if index < len(names) else f"#{index}"
            for key, want in slots.items():
                got = got_state.get(index, {}).get(key)
                if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor):
                    found = self._differs(f"the optimizer state '{key}' of '{label}' after the step", got, want,
                                          self.facts.stepped_at, tolerance=(UPDATE_TOLERANCE, ROUNDING))
                    if found is not None:
                        return found
        return None

    def _compare_groups(self, after: Mapping[str, Any], eager: _Eager) -> _Mismatch | None:
        """The device's param groups' hyperparameters against the script's at ``optimizer.step()``,
        and each weight's optimizer-state keys against eager's."""
        if not eager.updated or eager.optimizer is None:
            return None
        device = legacy_state.from_device(after, self.model, self.optimizer).get("optimizer", {})
        dev_groups = (after.get("optimizer") or {}).get("param_groups") or []
        names = list(after.get("param_names") or [])
        by_name = {n: i for i, g in enumerate(dev_groups) for n in
                   (names[k] for k in g.get("params", ()) if isinstance(k, int) and k < len(names))}
        own = {id(p): n for n, p in self.model.named_parameters()}
        for index, (group, values) in enumerate(zip(self.optimizer.param_groups if self.optimizer else [],
                                                    self.facts.group_values)):
            held = next((by_name[own[id(p)]] for p in group["params"] if own.get(id(p)) in by_name), None)
            if held is None:
                continue
            for key, want in values.items():
                got = dev_groups[held].get(key)
                if key == "lr" or got is None:
                    continue
                if _plain(got) != want:
                    return _Mismatch(f"param group {index}'s {key}: {_plain(got)!r} on the device, {want!r} in the "
                                     "script's optimizer", math.inf, 0.0, self.facts.stepped_at)
        labels = legacy_state.param_order(self.model, self.optimizer) or []
        got_state = device.get("state", {})
        for index, slots in eager.optimizer.state_dict().get("state", {}).items():
            want_keys, got_keys = set(slots), set(got_state.get(index, {}))
            if got_keys and want_keys != got_keys:
                label = labels[index] if index < len(labels) else f"#{index}"
                return _Mismatch(f"the optimizer state of '{label}': keys {sorted(got_keys)} on the device, "
                                 f"{sorted(want_keys)} in eager PyTorch", math.inf, 0.0, self.facts.stepped_at)
        return None

    def _differs(self, what: str, got: torch.Tensor, want: torch.Tensor, location: Location | None, *,
                 floor: float = 0.0, tolerance: tuple[float, float] | None = None) -> _Mismatch | None:
        """A value the step computed, against eager's: the largest difference (module manual)."""
        mismatch, a, b = _comparable(what, got, want, location)
        if mismatch is not None or a is None or b is None:
            return mismatch
        rtol, atol = tolerance or self._tolerance()
        difference = float((a - b).abs().max())
        allowed = atol + rtol * max(float(b.abs().max()), floor)
        return None if difference <= allowed else _Mismatch(what, difference, allowed, location)

    def _change_differs(self, what: str, got: torch.Tensor, want: torch.Tensor, was: torch.Tensor,
                        location: Location | None) -> _Mismatch | None:
        """A weight after the step against the update recomputed from the device's gradients (module manual)."""
        mismatch, a, b = _comparable(what, got, want, location)
        if mismatch is not None or a is None or b is None:
            return mismatch
        start = torch.nan_to_num(was.detach().cpu().double(), nan=0.0, posinf=0.0, neginf=0.0)
        difference = float(torch.linalg.vector_norm(a - b))
        allowed = UPDATE_TOLERANCE * float(torch.linalg.vector_norm(b - start)) + \
            ROUNDING * float(torch.linalg.vector_norm(b))
        return None if difference <= allowed else _Mismatch(what, difference, allowed, location)

    def _report(self, mismatch: _Mismatch) -> None:
        facts = self.facts
        source = f"\n    {mismatch.location.source_line}" if mismatch.location and mismatch.location.source_line else ""
        size = "" if math.isinf(mismatch.difference) or math.isnan(mismatch.difference) else \
            f": difference {mismatch.difference:.3g}, {facts.precision} allows {mismatch.allowed:.3g}"
        raise DeviceDiffers(
            f"{at(mismatch.location)}step {facts.number} on the device differs from eager PyTorch in {mismatch.what}"
            f"{size}.{source}\n"
            "The device ran something other than the script here: please report it with this message. To train "
            f"anyway, switch the check off (run.py --verify_steps 0, or {VERIFY_ENV}=0).")


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _comparable(what: str, got: torch.Tensor, want: torch.Tensor,
                location: Location | None) -> tuple[_Mismatch | None, torch.Tensor | None, torch.Tensor | None]:
    """Both tensors in float64 with their non-finite values set aside (the same NaNs and
    infinities on both sides, else a mismatch), or a mismatch of shape, dtype kind or exact
    integer values; (None, None, None) when there is nothing more to compare."""
    got, want = got.detach().cpu(), want.detach().cpu()
    if got.shape != want.shape:
        return _Mismatch(f"{what}: shape {tuple(got.shape)} on the device, {tuple(want.shape)} in eager",
                         math.inf, 0.0, location), None, None
    if not want.is_floating_point():
        same = torch.equal(got.to(want.dtype), want)
        return (None if same else _Mismatch(what, float((got.double() - want.double()).abs().max()), 0.0, location),
                None, None)
    a, b = got.double(), want.double()
    for check, label in ((torch.isnan, "NaN"), (torch.isposinf, "+inf"), (torch.isneginf, "-inf")):
        if not torch.equal(check(a), check(b)):
            return _Mismatch(f"{what} ({label} where the other side has none)", math.nan, 0.0, location), None, None
    if a.numel() == 0:
        return None, None, None
    return (None, torch.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0),
            torch.nan_to_num(b, nan=0.0, posinf=0.0, neginf=0.0))


def _skipped(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether the device's loss scaling skipped the step's update (an overflow)."""
    was = (before.get("scaler") or {}).get("overflows", 0)
    now = (after.get("scaler") or {}).get("overflows", 0)
    return bool(now > was)


class Verifier:
    """Which steps are checked, and the notices for those that cannot be (see the module manual)."""

    def __init__(self, steps: int, every: int) -> None:
        """``steps``: the first steps of each program; ``every``: one step in this many later (0: none)."""
        self.steps = steps
        self.every = every
        self._left = 0
        self._programs: set[str] = set()
        self._said: set[str] = set()
        self._stopped = False

    def program_loaded(self, key: str) -> None:
        """A program was loaded: a new one's first steps are checked (one loaded again is not)."""
        fresh = key not in self._programs
        self._programs.add(key)
        self._left = self.steps if fresh else 0

    def wants(self, global_step: int) -> bool:
        """Whether the step about to run (after ``global_step`` updates) is one to check."""
        if self._stopped:
            return False
        return self._left > 0 or (self.every > 0 and global_step > 0 and global_step % self.every == 0)

    def start(self, number: int, why_not: str, make: Callable[[], StepCheck | None]) -> StepCheck | None:
        """The check of this step (``make()``), or None with a notice (once per reason) when
        ``why_not`` says it cannot be checked; counts it."""
        self._left = max(0, self._left - 1)
        if why_not:
            self._left = 0
            if why_not not in self._said:
                self._said.add(why_not)
                log.warning("step %d is not checked against eager PyTorch: %s", number, why_not)
            return None
        return make()

    def finished(self, ok: bool) -> None:
        """A check ran; False: its eager run failed (the run goes on unchecked from here)."""
        if not ok:
            self._left = 0
            self._stopped = True
