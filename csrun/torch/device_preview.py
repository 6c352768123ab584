"""The CPU run warns about what the device will refuse: ``csrun_cpu`` keeps its promise.

The validation run (eager PyTorch on the CPU) runs anything PyTorch runs. The device does not:
it refuses, at the line, what it cannot run as written. :class:`DevicePreview` watches the CPU
run for those things and logs one warning each (``on the device: file:line: ...``), so a script
that validates on the CPU does not meet them first on the system:

* an optimizer type the system does not have;
* in the first step, reading a value computed from the model's outputs outside a step closure
  (``loss.item()``, ``if loss > x``, ``print(loss)``: the device's values exist only in closures),
  and reading a tensor's value inside the model's forward (data-dependent control flow, a tensor
  turned into a Python number: the capture refuses both);
* a forward that changes a Python value at every call, a module attribute or a global (a
  counter: the device runs the forward's Python once, when it compiles the step);
* gradient accumulation (``backward()`` without ``optimizer.step()`` in the first step) in
  pipelined mode.

The first costs nothing per step; the rest watch the first two steps only (a
``TorchFunctionMode`` in the first step; torch's global module hooks for the model's first two
calls, so the model object is left as it is).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Any, Callable

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from csrun.compiler.errors import at
from csrun.compiler.locate import caller_location
from csrun.compiler.optim import legacy_type_of, unsupported_optimizer_error
from csrun.compiler.python_globals import GlobalReads, as_now, global_changes
from csrun.compiler.python_state import forward_changes, in_forward
from csrun.driver.steps import ACCUMULATION_FIX

log = logging.getLogger("csrun.torch")

_READS = {
    "item": "calls .item() on", "tolist": "calls .tolist() on", "numpy": "calls .numpy() on",
    "__bool__": "takes the truth value of", "__float__": "takes float() of", "__int__": "takes int() of",
    "__index__": "uses as an index", "__format__": "formats", "__repr__": "prints", "__str__": "prints",
    "__array__": "converts to an array",
}
"""Tensor methods that read a value (what the device refuses on its values outside closures)."""

_FORWARD_CALLS_WATCHED = 2


class DevicePreview:
    """One CPU run's warnings about what the device will refuse (see the module manual)."""

    def __init__(self, *, streaming: bool = False) -> None:
        """``streaming``: weight-streaming mode (the device accumulates gradients there)."""
        self.streaming = streaming
        self._said: set[str] = set()
        self._steps = 0
        self._mode: _FirstStep | None = None
        self._stepped = 0
        self._stepped_before = 0
        self.in_forward = 0
        self.tracked: dict[int, weakref.ref[torch.Tensor]] = {}
        """The first step's values computed from the model's outputs, by id."""
        self.backward_at: Any = None

    def track(self, out: Any) -> None:
        """Remember the tensors of ``out`` as values computed from the model's outputs."""
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.tracked[id(leaf)] = weakref.ref(leaf)

    def is_tracked(self, args: Any) -> bool:
        """Whether any tensor of ``args`` was computed from the model's outputs."""
        if not self.tracked:
            return False
        for leaf in pytree.tree_leaves(args):
            if isinstance(leaf, torch.Tensor):
                ref = self.tracked.get(id(leaf))
                if ref is not None and ref() is leaf:
                    return True
        return False

    def warn(self, location: Any, text: str) -> None:
        """One warning per distinct text: ``on the device: file:line: text``."""
        line = f"on the device: {at(location)}{text}"
        if line not in self._said:
            self._said.add(line)
            log.warning("%s", line)

    # -- the user's objects ------------------------------------------------------------------------

    def module(self, model: torch.nn.Module) -> None:
        """Watch the model's first forwards (outputs tracked, Python values it changes) through
        torch's global module hooks, so the model itself is left as it is (it still copies and
        pickles), until two calls have been seen."""
        watched = weakref.ref(model)
        calls = [0]
        capture: list[contextlib.ExitStack] = []
        changed: list[list[Any]] = []
        handles: list[Any] = []

        reads: list[GlobalReads] = []
        read_before: list[tuple[Any, ...]] = [()]

        def before(module: torch.nn.Module, args: Any) -> None:
            if module is not watched():
                return
            calls[0] += 1
            stack = contextlib.ExitStack()
            changed.append(stack.enter_context(in_forward(module)))
            reads.append(stack.enter_context(GlobalReads().watching()))
            read_before[0] = as_now(read_before[0])  # what the loop left: only the call's own changes count
            capture.append(stack)
            self.in_forward += 1

        def after(module: torch.nn.Module, args: Any, out: Any) -> None:
            if module is not watched() or not capture:
                return
            capture.pop().close()
            self.in_forward -= 1
            seen = changed.pop()
            guards = reads.pop().guards()
            if calls[0] > 1:
                for problem in forward_changes(seen, module):
                    self.warn(problem.location, f"{problem.what}: refused ({problem.fix})")
                for problem in global_changes(read_before[0]):
                    self.warn(problem.location, f"{problem.what}: refused ({problem.fix})")
            read_before[0] = guards
            if self._mode is not None:
                self.track(out)
            if calls[0] >= _FORWARD_CALLS_WATCHED:
                for handle in handles:
                    handle.remove()

        handles.append(register_module_forward_pre_hook(before))
        handles.append(register_module_forward_hook(after, always_call=True))

    def optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Check the optimizer's type; count its steps."""
        if legacy_type_of(optimizer) is None:
            error = unsupported_optimizer_error(optimizer)
            self.warn(error.location, f"{error.what}: refused ({error.fix})")
        optimizer.register_step_post_hook(self._step_taken)

    def _step_taken(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._stepped += 1

    # -- the steps -------------------------------------------------------------------------------

    def begin_step(self) -> None:
        """A batch was handed out: the first step is watched."""
        self.end_step()
        self._steps += 1
        if self._steps == 1:
            self._stepped_before = self._stepped
            self.backward_at = None
            self._mode = _FirstStep(self)
            self._mode.__enter__()

    def end_step(self) -> None:
        """The step's boundary (before its closures run): what the first step did."""
        mode, self._mode = self._mode, None
        if mode is None:
            return
        mode.__exit__(None, None, None)
        self.tracked = {}
        if self.backward_at is not None and self._stepped == self._stepped_before and not self.streaming:
            self.warn(self.backward_at, f"gradient accumulation (loss.backward() without optimizer.step() in the "
                                        f"step): refused ({ACCUMULATION_FIX})")


class _FirstStep(TorchFunctionMode):
    """Sees every torch call of the first step: reads of the model's values, backward."""

    def __init__(self, preview: DevicePreview) -> None:
        super().__init__()
        self.preview = preview

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        preview = self.preview
        name = _name(func)
        derived = preview.is_tracked(args)
        if name in _READS and (preview.in_forward or derived):
            where = caller_location()
            if preview.in_forward:
                preview.warn(where, f"the model {_READS[name]} a tensor: the capture refuses data-dependent "
                                    "control flow and tensors turned into Python numbers (use torch.where, keep tensors)")
            else:
                preview.warn(where, f"the loop {_READS[name]} a value computed from the model's outputs outside a "
                                    "step closure: refused (read it in a step closure: cbtorch.add_step_closure / "
                                    "@step_closure)")
        elif name == "backward" and not preview.in_forward:
            preview.backward_at = caller_location()
        out = func(*args, **kwargs)
        if derived and not preview.in_forward:
            preview.track(out)
        return out


def _name(func: Callable[..., Any]) -> str:
    name = getattr(func, "__name__", "")
    if name == "__get__":
        owner = getattr(func, "__self__", None)
        name = getattr(owner, "__name__", "") or getattr(getattr(owner, "fget", None), "__name__", "")
    return name

