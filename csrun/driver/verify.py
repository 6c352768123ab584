"""The device checks itself against eager PyTorch: the first step of every program, or the first N.

Whatever csrun missed in a script, the numbers show it. For each verified step the driver
fetches the device's state before the step, runs the step on the device, fetches the state
after it, and runs the same step eagerly on the CPU from the state before
(:class:`StepCheck`):

* a copy of the user's model and of the user's torch optimizer (its class, its param groups,
  their hyperparameters), loaded with the device's state before the step;
* the step's calls and operations as the script made them (the recording:
  :meth:`~csrun.driver.recorded_step.Recording.run`, with each call's module modes, grad mode
  and Python values), ``loss.backward()``, the step's clipping (torch's own ``clip_grad_norm_`` /
  ``clip_grad_value_``, or the compile settings' as the CPU path applies it), the learning
  rate the script's optimizer had when it called ``optimizer.step()`` (or the compile settings'
  schedule at the global step), ``optimizer.step()`` of the user's class, and what came after it.

Then it compares, in this order, the loss, every value the step hands back (what closures
read), the gradient norm, and after the step every weight, buffer and optimizer state tensor.
The first one that differs by more than the precision allows (:data:`TOLERANCES`, a bound on
the largest difference relative to the tensor's largest value) stops the run with
:class:`DeviceDiffers`, naming the value, the tensor and the user's line that made it.

A step that draws random numbers (dropout) is checked on the in-process CPU emulator, whose
draws are made to match eager's (the random state is the same before both); elsewhere it is
not checked, with a notice. A step that updates gradients accumulated by earlier steps is not
checked (they are not part of the device's state), nor is one whose model cannot be copied or
run again eagerly (a notice says why; the run goes on).

How many: ``--verify_steps N`` (run.py), ``cbtorch.initialize(verify_steps=N)``, else
``CSRUN_VERIFY_STEPS`` (default 1: the first step of every program compiled; 0: off).
"""

from __future__ import annotations

import collections
import copy
import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from csrun.compiler.errors import Location, at
from csrun.driver import legacy_state
from csrun.driver.clipping import NORM, VALUE, torch_clipping
from csrun.driver.options import VERIFY_ENV
from csrun.driver.recorded_step import Recording
from csrun.program.clipping import clip_gradients
from csrun.program.step_plan import StepPlan
from csrun.errors import UserError
from csrun.program.schedules import build_schedule

log = logging.getLogger("csrun.driver")

TOLERANCES: dict[str, tuple[float, float, float]] = {
    "float32": (1e-5, 1e-6, 1e-4),
    "float16": (2e-2, 2e-3, 5e-2),
    "bfloat16": (6e-2, 6e-3, 1.5e-1),
    "cbfloat16": (6e-2, 6e-3, 1.5e-1),
}
"""Precision -> (relative, absolute, change). A value the step computed (an output, an optimizer
state tensor) differs when its largest difference exceeds ``absolute + relative * (its largest
magnitude in eager)``; a weight or buffer the step changed differs when the change differs:
``|device change - eager change| > change * |eager change| + ROUNDING * |eager weight|`` (norms
over the tensor), so a wrong learning rate or momentum shows however small the update is next to
the weight, and a few elements rounded differently in 16 bits (an Adam update's sign near a
zero gradient) do not."""

ROUNDING = 1e-7
"""A weight's own float32 rounding, relative to its norm: what a change may differ by when the
eager change is next to nothing."""

_OPTIMIZER_OVERRIDES = ("step", "zero_grad", "state_dict", "load_state_dict", "_csrun_scheduler_watch",
                        "_cstorch_lr_scheduler", "_opt_called")
"""Instance attributes csrun (or a scheduler) put on the user's optimizer; its copy goes without them."""


class DeviceDiffers(UserError):
    """A verified step gave other numbers on the device than in eager PyTorch."""


def draws_random(program: torch.export.ExportedProgram | None) -> bool:
    """Whether the program draws random numbers (dropout and the like)."""
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


@dataclass
class _Mismatch:
    what: str
    difference: float
    allowed: float
    location: Location | None


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
        try:
            eager_outputs, eager_state = self._eager(after)
        except Exception as exc:  # noqa: BLE001 - a model that cannot be copied or rerun: the run goes on unchecked
            log.warning("step %d is not checked against eager PyTorch: its eager run failed (%s: %s)",
                        self.facts.number, type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "")
            return False
        finally:
            torch.random.set_rng_state(device_rng)
        mismatch = self._compare_outputs(outputs, eager_outputs) or self._compare_state(after, eager_state)
        if mismatch is not None:
            self._report(mismatch)
        return True

    # -- the eager step --------------------------------------------------------------------------

    def _eager(self, after: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        facts = self.facts
        ref_model, ref_opt = self._copies()
        state = legacy_state.from_device(self.before, self.model, self.optimizer)
        ref_model.load_state_dict(state["model"], strict=False)
        fresh = state.get("global_step", 0) == 0 and self.optimizer is not None and not self.optimizer.state
        if ref_opt is not None and state.get("optimizer") and not fresh:  # the run's first update: torch's own start
            ref_opt.load_state_dict(state["optimizer"])
        forward = type(ref_model).forward.__get__(ref_model)
        extra: dict[str, Any] = {}
        skipped = _skipped(self.before, after) if facts.plan.update else False

        def update(values: dict[int, Any]) -> None:
            if facts.mode != "train" or not facts.plan.backward or facts.recording.loss is None:
                return
            values[facts.recording.loss].backward()
            if not facts.plan.update or ref_opt is None:
                return
            norm = self._clip(ref_model)
            if norm is not None:
                extra["grad_norm"] = norm
            self._set_learning_rates(ref_opt, state.get("global_step", 0))
            if not skipped:
                ref_opt.step()

        context = torch.enable_grad() if facts.mode == "train" else torch.no_grad()
        with context:
            outputs = facts.recording.run(forward, ref_model, list(facts.inputs), at_update=update,
                                          recorded_on=self.model)
        outputs.update(extra)
        if facts.mode != "train":
            return outputs, None
        return outputs, {"model": ref_model.state_dict(),
                         "optimizer": ref_opt.state_dict() if ref_opt is not None else {}}

    def _copies(self) -> tuple[torch.nn.Module, torch.optim.Optimizer | None]:
        """Copies of the user's model and optimizer that know nothing of csrun."""
        memo: dict[int, Any] = {id(self.view): None}
        ref_model = copy.deepcopy(self.model, memo)
        for module in ref_model.modules():
            for name in ("forward", "zero_grad"):
                module.__dict__.pop(name, None)
        if self.optimizer is None:
            return ref_model, None
        mapping = {id(p): q for p, q in zip(self.model.parameters(), ref_model.parameters())}
        ref_opt = object.__new__(type(self.optimizer))
        ref_opt.__dict__.update({k: v for k, v in self.optimizer.__dict__.items() if k not in _OPTIMIZER_OVERRIDES})
        ref_opt.defaults = dict(self.optimizer.defaults)
        ref_opt.param_groups = [{**{k: copy.deepcopy(v) for k, v in g.items() if k != "params"},
                                 "params": [mapping[id(p)] for p in g["params"]]} for g in self.optimizer.param_groups]
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
            rate = float(build_schedule(facts.schedule)(int(global_step)))
            for g in optimizer.param_groups:
                g["lr"] = rate
        elif facts.learning_rates is not None:
            for g, rate in zip(optimizer.param_groups, facts.learning_rates):
                g["lr"] = rate

    # -- comparing -------------------------------------------------------------------------------

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

    def _compare_state(self, after: Mapping[str, Any], eager: Mapping[str, Any] | None) -> _Mismatch | None:
        if eager is None:
            return None
        device = legacy_state.from_device(after, self.model, self.optimizer)
        before = legacy_state.from_device(self.before, self.model, self.optimizer)["model"]
        first_call = next((e.location for e in self.facts.recording.entries if e.func is None), None)
        buffers = {n for n, _ in self.model.named_buffers()}
        for name, want in eager["model"].items():
            got, was = device["model"].get(name), before.get(name)
            if got is None or was is None:
                continue
            kind = "the buffer" if name in buffers else "the weight"
            where = first_call if name in buffers else self.facts.stepped_at
            found = self._change_differs(f"{kind} '{name}': its change in the step", got, want, was, where)
            if found is not None:
                return found
        names = legacy_state.param_order(self.model, self.optimizer) or []
        got_state = device.get("optimizer", {}).get("state", {})
        for index, slots in eager.get("optimizer", {}).get("state", {}).items():
            for key, want in slots.items():
                got = got_state.get(index, {}).get(key)
                if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor):
                    label = names[index] if index < len(names) else f"#{index}"
                    found = self._differs(f"the optimizer state '{key}' of '{label}' after the step", got, want,
                                          self.facts.stepped_at)
                    if found is not None:
                        return found
        return None

    def _differs(self, what: str, got: torch.Tensor, want: torch.Tensor, location: Location | None) -> _Mismatch | None:
        """A value the step computed, against eager's: the largest difference (module manual)."""
        mismatch, a, b = _comparable(what, got, want, location)
        if mismatch is not None or a is None or b is None:
            return mismatch
        rtol, atol, _ = TOLERANCES.get(self.facts.precision, TOLERANCES["float32"])
        difference = float((a - b).abs().max())
        allowed = atol + rtol * float(b.abs().max())
        return None if difference <= allowed else _Mismatch(what, difference, allowed, location)

    def _change_differs(self, what: str, got: torch.Tensor, want: torch.Tensor, was: torch.Tensor,
                        location: Location | None) -> _Mismatch | None:
        """A weight or buffer after the step, against eager's: the change the step made (module manual)."""
        mismatch, a, b = _comparable(what, got, want, location)
        if mismatch is not None or a is None or b is None:
            return mismatch
        start = torch.nan_to_num(was.detach().cpu().double(), nan=0.0, posinf=0.0, neginf=0.0)
        change = TOLERANCES.get(self.facts.precision, TOLERANCES["float32"])[2]
        difference = float(torch.linalg.vector_norm(a - b))
        allowed = change * float(torch.linalg.vector_norm(b - start)) + ROUNDING * float(torch.linalg.vector_norm(b))
        return None if difference <= allowed else _Mismatch(what, difference, allowed, location)

    def _report(self, mismatch: _Mismatch) -> None:
        facts = self.facts
        source = f"\n    {mismatch.location.source_line}" if mismatch.location and mismatch.location.source_line else ""
        raise DeviceDiffers(
            f"{at(mismatch.location)}step {facts.number} on the device differs from eager PyTorch in {mismatch.what}: "
            f"difference {mismatch.difference:.3g}, {facts.precision} allows {mismatch.allowed:.3g}.{source}\n"
            "The device ran something other than the script here: please report it with this message. To train "
            f"anyway, switch the check off (run.py --verify_steps 0, or {VERIFY_ENV}=0).")


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
