"""The device interface csrun.torch talks to, whichever emulator sits behind it.

:class:`Device` is implemented by :class:`~csrun.emulator.embedded.EmbeddedDevice` (the engine
on a worker thread in this process) and :class:`~csrun.emulator.remote.client.RemoteDevice` (a
``cs_emulator`` server over TCP). The contract:

1. :meth:`Device.load` a program and its spec (once per program; a new load replaces the old);
2. :meth:`Device.submit` batches; each returns a :class:`StepHandle` at once. At most
   ``queue_depth`` steps are in flight; a further submit waits for the oldest to finish;
3. read outputs at the step boundary with ``handle.result()`` (CPU tensors). A step that failed
   raises there, and every later call raises the same error (the device is then unusable);
4. :meth:`Device.state_dict` / :meth:`Device.load_state_dict` fetch and restore the whole device
   state (params, buffers, optimizer, scaler, global step) as CPU tensors, in order with steps;
5. :meth:`Device.close` when done (also a context manager).
"""

from __future__ import annotations

import abc
from typing import Any

import torch

from csrun.emulator.handles import StepHandle
from csrun.program.step_plan import FULL_STEP, StepPlan
from csrun.program.spec import ProgramSpec


class Device(abc.ABC):
    """A wafer emulator: runs a loaded program one step per submitted batch."""

    @abc.abstractmethod
    def load(self, program: torch.export.ExportedProgram, spec: ProgramSpec) -> None:
        """Load a program (weights come from the program) and build its optimizer and schedule."""

    @abc.abstractmethod
    def submit(self, batch: Any, plan: StepPlan = FULL_STEP) -> StepHandle:
        """Queue one step on ``batch`` (a pytree of CPU tensors shaped as captured); ``plan``: what
        a training step runs after the forward (:class:`~csrun.program.step_plan.StepPlan`)."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Fetch the full device state to CPU after all submitted steps (see Engine.state_dict)."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True, load_optimizer: bool = True) -> None:
        """Load a state fetched by :meth:`state_dict` (after all submitted steps)."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait for every submitted step; raise the first step error, if any."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the device; pending steps are abandoned."""

    @property
    @abc.abstractmethod
    def global_step(self) -> int:
        """The device's global step after all steps finished so far (state_dict has the exact value)."""

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
