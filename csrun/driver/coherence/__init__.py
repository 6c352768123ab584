"""Host and device state are one state, kept coherent at every step boundary.

On the device path the device holds a copy of what the eager step reads from the host: the
weights and buffers, the optimizer's param groups and their hyperparameters, the trainable set,
how ``zero_grad()`` cleared the gradients. A script changes any of them between steps, the way
eager PyTorch lets it. :class:`Coherence` is the one mechanism that keeps the device's copy equal
to the host's: at each step's first model call and at its boundary it compares the host's view
with what the device was given, and either sends the change with the step or refuses it at the
line that made it, never trains something else in silence. Its parts, one concern each:

* :mod:`~csrun.driver.coherence.host_weights`: a weight or buffer edited on the host (version
  counters, and contents once the script has read them) is written to the device before the
  next step; an edit the device cannot place is refused.
* :mod:`~csrun.driver.coherence.hyperparameters`: each group's hyperparameters at
  ``optimizer.step()`` reach that update (per-step values in the step's plan); a host LR
  scheduler runs as in eager.
* :mod:`~csrun.driver.coherence.trainable`: a change of the trainable set or of the param groups
  compiles the step again, with one notice.
* :mod:`~csrun.driver.coherence.weight_names`: at a switch of programs, the state carried over
  follows each weight across a rename or a freeze and unfreeze.
* :mod:`~csrun.driver.coherence.optimizer_state`: ``optimizer.state`` shows the device's when read,
  and a change the script makes to it is written to the device before the next step.

The ``zero_grad`` mode travels with the step order (:class:`~csrun.driver.steps.StepOrder`), the
grad and autocast context of each call with the recording (:mod:`~csrun.driver.recorded_step`),
Python values the forward reads with their guards (:mod:`~csrun.compiler.python_state`), and
the step's random draws with its inputs (:mod:`~csrun.driver.random_draws`); this room owns the
state the host keeps between steps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping

import torch

from csrun.compiler.errors import Location
from csrun.driver.coherence.host_weights import HostEditError, HostWeights, split_state
from csrun.driver.coherence.hyperparameters import GroupHyperparameters, HyperparameterError, device_group_names
from csrun.driver.coherence.optimizer_state import DeviceOptimizerState
from csrun.driver.coherence.trainable import TrainableSet, TrainableSetChanged, fingerprint
from csrun.program.step_plan import StepPlan

__all__ = ["Coherence", "HostEditError", "HyperparameterError", "TrainableSetChanged"]


class Coherence:
    """The host's state against the device's copy of it (see the module manual)."""

    def __init__(self, notice: Callable[[str], None]) -> None:
        """``notice``: where the one-line notice of a recompile goes."""
        self.notice = notice
        self.weights = HostWeights()
        self.trainable = TrainableSet()
        self.groups: GroupHyperparameters | None = None
        self.model: torch.nn.Module | None = None
        self._modules: list[torch.nn.Module] = []
        """The model's modules (a submodule added later comes with new weights: the recompile finds it)."""
        self.optimizer: torch.optim.Optimizer | None = None
        self.recompile_due = False
        """The trainable set changed since the loaded program was compiled: compile it again."""
        self.optimizer_state_edited = False
        """The script changed the optimizer's state since the last step: the driver writes it first."""
        self._fetch_state: Callable[[], Mapping[int, Mapping[str, Any]] | None] = lambda: None

    def attach_model(self, model: torch.nn.Module) -> None:
        """Keep the wrapped model's state coherent."""
        self.model = model
        self._modules = list(model.modules())
        self.weights.attach(model)
        if self.optimizer is not None:
            self._groups(self.optimizer)

    def attach_optimizer(self, optimizer: torch.optim.Optimizer,
                         fetch: Callable[[], Mapping[int, Mapping[str, Any]] | None]) -> None:
        """Keep the wrapped optimizer's groups and state coherent (``add_param_group`` is seen
        with its line; ``fetch``: the device's optimizer state by the host's parameter numbering)."""
        self.optimizer = optimizer
        self._fetch_state = fetch
        self.optimizer_loaded()
        own = optimizer.add_param_group
        trainable = self.trainable

        def add_param_group(param_group: dict[str, Any]) -> None:
            trainable.changed_at()
            own(param_group)

        optimizer.add_param_group = add_param_group  # type: ignore[method-assign]
        self._groups(optimizer)

    def optimizer_loaded(self) -> None:
        """The optimizer's ``state`` became a plain dict again (``load_state_dict``, or wrapping):
        make it :class:`DeviceOptimizerState`, holding what it held."""
        optimizer = self.optimizer
        if optimizer is None or isinstance(optimizer.state, DeviceOptimizerState):
            return
        state = DeviceOptimizerState(self._fetch_state, lambda: [p for g in optimizer.param_groups for p in g["params"]],
                                     dict(optimizer.state))
        optimizer.state = state  # type: ignore[assignment]
        state.synced()

    @property
    def optimizer_state(self) -> DeviceOptimizerState | None:
        """The wrapped optimizer's state, when it is csrun's."""
        state = getattr(self.optimizer, "state", None)
        return state if isinstance(state, DeviceOptimizerState) else None

    def _groups(self, optimizer: torch.optim.Optimizer) -> None:
        model = self.model
        self.groups = GroupHyperparameters(optimizer, lambda: {id(p): n for n, p in model.named_parameters()}
                                           if model is not None else {})

    def _fingerprint(self) -> tuple[Any, ...]:
        return fingerprint(self._modules, self.optimizer)

    # -- the program --------------------------------------------------------------------------

    def loaded(self, *, trains: bool, host_lr: bool, host_current: bool) -> None:
        """A program was loaded (``trains``: a training program; ``host_lr``: no compiled schedule
        drives the learning rate; ``host_current``: the host copies hold the device's values)."""
        self.weights.synced(None, current=host_current)
        if self.model is not None:
            self._modules = list(self.model.modules())
        if trains:
            self.trainable.loaded(self._fingerprint())
            self.recompile_due = False
            if self.groups is not None:
                self.groups.loaded(host_lr=host_lr)

    # -- the step -----------------------------------------------------------------------------

    def before_step(self, trains: bool) -> None:
        """At the step's first model call: the host's changes since the last step (edits to
        write, a new trainable set to compile for, with one notice)."""
        self.weights.before_step()
        if self.optimizer is not None and self.optimizer_state is None:  # the script gave it a new state dict
            self.optimizer_loaded()
            self.optimizer_state_edited = True
        elif self.optimizer_state is not None and self.optimizer_state.edited():
            self.optimizer_state_edited = True
        if trains and self.model is not None and self.trainable.before_step(self._fingerprint()):
            if not self.recompile_due:
                self.notice(f"{_where(self.trainable.where)}{self.trainable.describe(self.model)}: the step is "
                            "compiled again for the new set (the weights and the optimizer state carry over)")
            self.recompile_due = True

    def stepped(self, location: Location | None) -> None:
        """``optimizer.step()``: the param groups as this update reads them."""
        if self.groups is not None:
            self.groups.stepped(location)

    def after_call(self, recorded: bool) -> None:
        """A model call returned; ``recorded``: it ran the forward on the host copies for shapes."""
        if recorded:
            self.weights.own_change()

    def at_boundary(self, trains: bool) -> dict[str, Any] | None:
        """The step's boundary, before anything else (a compile runs the model again): the host's
        edits to write to the device before the step (None when there are none); refuses what
        changed during the step."""
        writes = self.weights.take()
        if trains:
            self.trainable.at_boundary(self._fingerprint())
        return split_state(self.model, writes) if writes and self.model is not None else None

    def plan(self, plan: StepPlan, device_state: Callable[[], Mapping[str, Any]]) -> StepPlan:
        """A training step's plan with its update's hyperparameters (once the program is loaded)."""
        if plan.update and self.groups is not None:
            entries = self.groups.entries(lambda: device_group_names(device_state()))
            if entries:
                return replace(plan, hyperparameters=entries)
        return plan

    def sent(self, trains: bool) -> None:
        """The step went to the device."""
        self.weights.sent(trains)
        if trains and self.optimizer_state is not None:
            self.optimizer_state.sent()

    def flush(self) -> dict[str, Any] | None:
        """Between steps (a state is taken, the Session ends): the host's edits since the last step
        to write now (None when there are none)."""
        writes = self.weights.flush()
        return split_state(self.model, writes) if writes and self.model is not None else None

    # -- the state view (csrun.driver.state_view) -------------------------------------------------

    def before_refresh(self) -> None:
        """The host copies are about to be overwritten with the device's."""
        self.weights.check_current()

    def refreshed(self, values: Mapping[str, torch.Tensor]) -> None:
        """The host copies now hold the device's values ``values`` (the model's state by name)."""
        self.weights.synced(values, current=True)

    def state_loaded(self, *, host_current: bool) -> None:
        """A state was loaded into the device (``host_current``: and into the host copies too)."""
        self.weights.synced(None, current=host_current)
        if self.optimizer_state is not None:
            self.optimizer_state.sent()  # read again from the device at the next read

    def trainable_changed(self) -> None:
        """``requires_grad_`` on a module of the model: remember the line for the recompile's notice."""
        self.trainable.changed_at()


def _where(location: Location | None) -> str:
    return f"{location.filename}:{location.lineno}: " if location is not None else ""
