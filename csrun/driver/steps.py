"""The order of a training step's pieces on the device, and what each step asks the device to run.

What the loop holds on the device are step values (:mod:`csrun.driver.step_recording`);
``loss.backward()`` on one names the loss, and the device runs backward itself.
:class:`StepOrder` checks that the loop calls the training step's pieces in the order eager
PyTorch needs them::

    optimizer.zero_grad()      # here, or after optimizer.step()
    loss = model(batch)
    loss.backward()
    optimizer.step()

and raises :class:`StepOrderError` naming that order otherwise. At each step's boundary
:meth:`StepOrder.end_step` turns what the step did into the device's
:class:`~csrun.program.step_plan.StepPlan`, so the device runs exactly that:

* ``model(batch)`` alone: the forward, no gradients, no update, the global step stays;
* ``model(batch)`` and ``loss.backward()`` without ``optimizer.step()``: **gradient
  accumulation**, the gradients are kept for the next update. Weight-streaming mode runs it, as
  the system did; pipelined mode refuses it at the ``backward()`` line (the system updated the
  weights every step there) with the fix;
* all three: the usual step.

A ``backward()`` onto the gradients of the last update (no ``zero_grad()`` since
``optimizer.step()``) is refused: eager PyTorch would add the two, which the device does not
keep. In eval mode only ``model(batch)`` belongs in a step.
"""

from __future__ import annotations

from typing import Literal

from csrun.compiler.errors import Location, at
from csrun.compiler.locate import Site, caller_location, caller_site, location_of
from csrun.program.step_plan import FULL_STEP, StepPlan
from csrun.errors import UserError

ORDER = ("each training step calls, in this order: model(batch), loss.backward(), optimizer.step(); "
         "optimizer.zero_grad() goes before model(batch) or after optimizer.step()")

ACCUMULATION_FIX = ("pipelined mode applies the update every step, as the system did: run it in weight-streaming "
                    "mode (python-ws, run.py --execution_strategy weight_streaming), where the device accumulates "
                    "the gradients until optimizer.step(), or train on batches k times larger")


Phase = Literal["idle", "forward", "backward", "stepped"]
"""Where the current training step is."""

Gradients = Literal["none", "accumulated", "applied"]
"""The gradients the device holds after a step: none, accumulated for a later update, or those
an update used (eager PyTorch keeps them until ``zero_grad()``)."""


class StepOrderError(UserError):
    """The loop called forward, backward, step or zero_grad out of order."""


class GradientAccumulation(StepOrderError):
    """``backward()`` without ``optimizer.step()`` in a step, where the device cannot accumulate."""


class StepOrder:
    """The state of the current step: idle -> forward -> backward -> stepped."""

    def __init__(self) -> None:
        self.phase: Phase = "idle"
        self.mode: Literal["train", "eval"] = "train"
        self.accumulates = False
        """The device accumulates gradients (weight-streaming mode); else accumulation is refused."""
        self.step_number = 0
        """Number of the device step the last forward submitted."""
        self.gradients: Gradients = "none"
        self.zeroed = True
        """``zero_grad()`` was called since the last ``backward()``."""
        self.clear_before_backward = True
        """The current step's ``backward()`` came after a ``zero_grad()``: it starts from no gradients."""
        self.to_none = True
        """The last ``zero_grad()``'s ``set_to_none`` (False: the gradients it cleared stay, as zeros)."""
        self.clear_to_none = True
        """:attr:`to_none` as the current step's ``backward()`` found it."""
        self.scaled = False
        """A loss scaler scaled this step's loss (the device scales it itself)."""
        self.unscaled = False
        """... and unscaled the gradients (``scaler.unscale_(optimizer)``) before clipping them."""
        self._backward_site: Site | None = None
        self._stepped_site: Site | None = None

    @property
    def backward_at(self) -> Location | None:
        """Where the last ``loss.backward()`` was called."""
        return location_of(*self._backward_site) if self._backward_site else None

    @property
    def stepped_at(self) -> Location | None:
        """Where the last ``optimizer.step()`` was called."""
        return location_of(*self._stepped_site) if self._stepped_site else None

    def _fail(self, what: str, location: Location | None = None) -> None:
        raise StepOrderError(f"{at(location or caller_location())}{what}: {ORDER}")

    def forward(self, step_number: int) -> None:
        """``model(batch)`` opened device step ``step_number`` (the previous step has ended)."""
        self.phase = "forward"
        self.step_number = step_number
        self.scaled = self.unscaled = False

    def loss_scaled(self, unscaled: bool) -> None:
        """The loop's loss scaler scaled this step's loss (``unscaled``: then unscaled its gradients)."""
        if unscaled:
            self.unscaled = True
        else:
            self.scaled = True

    def backward(self) -> None:
        """``loss.backward()`` in the current step (the recorder checks it is on a scalar of this step)."""
        if self.mode != "train":
            raise StepOrderError(f"{at(caller_location())}loss.backward() in an eval Session: eval steps run the "
                                 "forward only")
        if self.phase == "backward":
            raise StepOrderError(f"{at(caller_location())}loss.backward() was called twice in one step: the system runs "
                                 "one backward per step; add the losses and call backward() once")
        if self.phase != "forward":
            self._fail("loss.backward() was called without a new model(batch) before it")
        if self.gradients == "applied" and not self.zeroed:
            where = f" at {self.stepped_at.filename}:{self.stepped_at.lineno}" if self.stepped_at else ""
            raise StepOrderError(
                f"{at(caller_location())}loss.backward() adds to the gradients of the last optimizer.step(){where}: "
                "optimizer.zero_grad() (or model.zero_grad()) was not called since, so eager PyTorch would update "
                f"with their sum, which the device does not keep; {ORDER}")
        self._backward_site = caller_site()
        self.clear_before_backward, self.zeroed = self.zeroed, False
        self.clear_to_none = self.to_none
        self.phase = "backward"

    def optimizer_step(self) -> None:
        """``optimizer.step()``."""
        if self.mode != "train":
            raise StepOrderError(f"{at(caller_location())}optimizer.step() in an eval Session: eval steps run the "
                                 "forward only")
        if self.phase != "backward":
            self._fail("optimizer.step() was called before loss.backward()" if self.phase == "forward"
                       else "optimizer.step() was called without model(batch) and loss.backward() before it")
        self._stepped_site = caller_site()
        self.phase = "stepped"

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``optimizer.zero_grad()`` / ``model.zero_grad()``: not between backward and step (it would
        drop the gradients the step is about to apply); ``set_to_none`` goes with the next step's plan."""
        if self.phase == "backward":
            self._fail("optimizer.zero_grad() was called between loss.backward() and optimizer.step()")
        self.zeroed = True
        self.to_none = bool(set_to_none)

    def end_step(self) -> StepPlan:
        """The training step's boundary: what the device runs after the forward (see the module manual)."""
        phase, self.phase = self.phase, "idle"
        if phase == "stepped":
            self.gradients = "applied"
            if self.clear_before_backward:
                return FULL_STEP if self.clear_to_none else StepPlan(grads_to_none=False)
            return StepPlan(clear_grads=False)
        if phase == "backward":
            if not self.accumulates:
                raise GradientAccumulation(
                    f"{at(self.backward_at)}gradient accumulation: loss.backward() without optimizer.step() in this "
                    f"step; {ACCUMULATION_FIX}")
            self.gradients = "accumulated"
            return StepPlan(update=False, clear_grads=self.clear_before_backward,
                            grads_to_none=self.clear_to_none or not self.clear_before_backward)
        return StepPlan(backward=False, update=False, clear_grads=False)

    def reset(self, mode: Literal["train", "eval"]) -> None:
        """A new Session in ``mode``: no step open (the device's gradients are as they were)."""
        self.mode = mode
        self.phase = "idle"
