"""The order of a training step's pieces on the device.

What the loop holds on the device are step values (:mod:`csrun.driver.step_recording`);
``loss.backward()`` on one names the loss, and the device runs backward itself.
:class:`StepOrder` checks that the loop calls the training step's pieces in the usual order,
as eager PyTorch needs them::

    optimizer.zero_grad()      # here, or after optimizer.step()
    loss = model(batch)
    loss.backward()
    optimizer.step()

and raises :class:`StepOrderError` naming that order otherwise. In eval mode only
``model(batch)`` belongs in a step.
"""

from __future__ import annotations

from typing import Literal

from csrun.errors import UserError

ORDER = ("each training step calls, in this order: model(batch), loss.backward(), optimizer.step(); "
         "optimizer.zero_grad() goes before model(batch) or after optimizer.step()")


Phase = Literal["idle", "forward", "backward", "stepped"]
"""Where the current training step is."""


class StepOrderError(UserError):
    """The loop called forward, backward, step or zero_grad out of order."""


class StepOrder:
    """The state of the current step: idle -> forward -> backward -> stepped."""

    def __init__(self) -> None:
        self.phase: Phase = "idle"
        self.mode: Literal["train", "eval"] = "train"
        self.step_number = 0
        """Number of the device step the last forward submitted."""
        self.scheduler_stepped = False
        """``lr_scheduler.step()`` was called in this step."""

    def _fail(self, what: str) -> None:
        raise StepOrderError(f"{what}: {ORDER}")

    def forward(self, step_number: int) -> None:
        """``model(batch)`` was sent as device step ``step_number``."""
        self.check_forward()
        self.phase = "forward"
        self.step_number = step_number
        self.scheduler_stepped = False

    def check_forward(self) -> None:
        """Raise if a new forward would be out of order (checked before the batch is sent)."""
        if self.mode == "train" and self.phase in ("forward", "backward"):
            missing = "loss.backward() and optimizer.step()" if self.phase == "forward" else "optimizer.step()"
            self._fail(f"model(batch) was called again before {missing} of the previous step")

    def backward(self) -> None:
        """``loss.backward()`` in the current step (the recorder checks it is on a scalar of this step)."""
        if self.mode != "train":
            raise StepOrderError("loss.backward() in an eval Session: eval steps run the forward only")
        if self.phase != "forward":
            self._fail("loss.backward() was called without a new model(batch) before it")
        self.phase = "backward"

    def optimizer_step(self) -> None:
        """``optimizer.step()``."""
        if self.mode != "train":
            raise StepOrderError("optimizer.step() in an eval Session: eval steps run the forward only")
        if self.phase != "backward":
            self._fail("optimizer.step() was called before loss.backward()" if self.phase == "forward"
                       else "optimizer.step() was called without model(batch) and loss.backward() before it")
        self.phase = "stepped"

    def scheduler_step(self) -> None:
        """``lr_scheduler.step()``: once per training step, after ``optimizer.step()`` (the device
        computes the learning rate from the global step, so the schedule advances with every step)."""
        if self.mode != "train":
            raise StepOrderError("lr_scheduler.step() in an eval Session: eval steps run the forward only")
        if self.phase != "stepped":
            self._fail("lr_scheduler.step() was called before optimizer.step(); call it after optimizer.step(), "
                       "once every step")
        if self.scheduler_stepped:
            self._fail("lr_scheduler.step() was called twice in one step; the device advances the schedule once "
                       "per step")
        self.scheduler_stepped = True

    def check_scheduler_stepped(self) -> None:
        """At a training step's boundary, with a scheduler: it must have been stepped (every step)."""
        if self.mode == "train" and self.phase == "stepped" and not self.scheduler_stepped:
            raise StepOrderError("the step ended without lr_scheduler.step(): the device advances the learning "
                                 "rate every step; call scheduler.step() after optimizer.step() in every step "
                                 "(a schedule per epoch: give it in steps)")

    def zero_grad(self) -> None:
        """``optimizer.zero_grad()``: not between backward and step (it would drop the gradients)."""
        if self.phase == "backward":
            self._fail("optimizer.zero_grad() was called between loss.backward() and optimizer.step()")

    def finish(self) -> None:
        """The session ended: the last training step must be complete."""
        phase, self.phase = self.phase, "idle"
        if self.mode == "train" and phase in ("forward", "backward"):
            missing = "loss.backward() and optimizer.step()" if phase == "forward" else "optimizer.step()"
            self._fail(f"the session ended before {missing} of the last step")
