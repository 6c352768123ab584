"""Each param group's hyperparameters: what the script's optimizer holds at ``optimizer.step()``
reaches the device's optimizer for that update.

Scripts change them between steps: a hand-written warm-up (``for g in opt.param_groups:
g["lr"] = warmup(step)``), a weight decay or momentum schedule, ``betas`` switched mid-run, a
host LR scheduler (``LambdaLR``, ``OneCycleLR``, ``ReduceLROnPlateau``, Hugging Face's
``get_*_schedule_with_warmup``) writing ``lr`` every step. Eager PyTorch reads the group at
``optimizer.step()``; so does :class:`GroupHyperparameters`, and the step's plan carries every
value that differs from what the device's optimizer was compiled with
(:attr:`~csrun.program.step_plan.StepPlan.hyperparameters`), mapped to the device's groups by
the weights they hold. The device keeps a value once given, as the script's group does.

The learning rate is the host's own when the script computes it: when no compile setting
(a params ``learning_rate`` schedule, a cstorch scheduler) drives it, every update takes each
group's ``lr`` as the script's optimizer holds it, so any host scheduler runs exactly as in eager
PyTorch. With a compiled schedule, the device computes the rate from the global step (as the
system did, and as the CPU path's rules do, overriding what a script writes into ``lr``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Collection, Mapping, Sequence

import torch

from csrun.compiler.errors import Location, at
from csrun.errors import UserError
from csrun.program.step_plan import HyperparameterValue

NOT_HYPERPARAMETERS = frozenset({"params", "initial_lr", "foreach", "fused", "capturable", "differentiable",
                                 "param_names"})
"""Param group keys that say how torch runs an update, or which weights it holds, not what it computes."""

Entry = tuple[int, str, HyperparameterValue]
"""``(device group, key, value)`` as the plan carries it."""


class HyperparameterError(UserError):
    """A param group's hyperparameter the device cannot take (a value of another kind, not finite)."""


def group_values(group: Mapping[str, Any], known: Collection[str]) -> dict[str, HyperparameterValue]:
    """A param group's hyperparameters as plain values (a tensor ``lr`` as its number): the keys
    its optimizer's ``defaults`` name (``known``; an LR scheduler's own keys in the group are not
    the update's); keys whose values are not data (a callable, None) are left out."""
    out: dict[str, HyperparameterValue] = {}
    for key, value in group.items():
        if key in NOT_HYPERPARAMETERS or key not in known:
            continue
        plain = _plain(value)
        if plain is not None:
            out[key] = plain
    return out


def _plain(value: Any) -> HyperparameterValue | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, torch.Tensor):
        return float(value.detach().reshape(-1)[0]) if value.numel() == 1 else None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, (int, float, torch.Tensor))
                                                          and not isinstance(v, bool) for v in value):
        return tuple(float(v) for v in value)
    return None


class GroupHyperparameters:
    """One wrapped optimizer's param groups against the device's (see the module manual)."""

    def __init__(self, optimizer: torch.optim.Optimizer, names: Callable[[], Mapping[int, str]]) -> None:
        """``names``: the model's weight names by ``id`` (to match groups with the device's)."""
        self.optimizer = optimizer
        self._names = names
        self._compiled: list[dict[str, HyperparameterValue]] | None = None
        """Each group's values as the device's optimizer holds them: compiled, then as sent."""
        self._at_step: list[dict[str, HyperparameterValue]] | None = None
        self._device_groups: list[list[int]] | None = None
        self.host_lr = False
        """Every update takes the script's ``lr`` (no compiled schedule drives it)."""
        self._stepped_at: Location | None = None
        self.last: list[dict[str, HyperparameterValue]] = []
        """The groups' values at the last ``optimizer.step()`` (what the check's eager optimizer takes)."""

    def loaded(self, *, host_lr: bool) -> None:
        """A program was loaded, compiled from the groups as they are now."""
        self._compiled = [group_values(g, self.optimizer.defaults) for g in self.optimizer.param_groups]
        self._device_groups = None
        self.host_lr = host_lr

    def stepped(self, location: Location | None) -> None:
        """``optimizer.step()``: the groups as the update reads them (``location``: the call)."""
        self._at_step = [group_values(g, self.optimizer.defaults) for g in self.optimizer.param_groups]
        self.last = [dict(values) for values in self._at_step]
        self._stepped_at = location

    def entries(self, device_groups: Callable[[], list[list[str]]]) -> tuple[Entry, ...]:
        """The update's values that differ from the compiled ones, and with :attr:`host_lr` every
        group's ``lr`` (without it the compiled schedule's, whatever the script wrote), on the device's groups; ``device_groups``: each device group's weight names
        (asked once per program, when a value is to be sent)."""
        at_step, compiled = self._at_step, self._compiled
        self._at_step = None
        if at_step is None or compiled is None:
            return ()
        if len(at_step) != len(compiled):
            return ()  # a group added since the compile: the trainable set's change recompiles first
        changes: list[tuple[int, str, HyperparameterValue]] = []
        for index, (now, held) in enumerate(zip(at_step, compiled)):
            for key, value in now.items():
                if (self.host_lr if key == "lr" else key in held and value != held[key]):
                    changes.append((index, key, self._checked(index, key, value)))
                    held[key] = value  # the device keeps it from this update on
        if not changes:
            return ()
        mapping = self._mapping(device_groups)
        return tuple((device, key, value) for index, key, value in changes for device in mapping[index])

    def _checked(self, index: int, key: str, value: HyperparameterValue) -> HyperparameterValue:
        numbers = value if isinstance(value, tuple) else (() if isinstance(value, bool) else (value,))
        if not all(math.isfinite(v) for v in numbers):
            raise HyperparameterError(f"{at(self._stepped_at)}param group {index}'s {key} is {value!r} at "
                                      "optimizer.step(): the device takes finite values only")
        return value

    def _mapping(self, device_groups: Callable[[], list[list[str]]]) -> list[list[int]]:
        """Host group -> the device groups holding its weights (the device may split a group: a
        frozen weight is in none, ``exclude_from_weight_decay`` makes two)."""
        if self._device_groups is None:
            names = self._names()
            where: dict[str, int] = {}
            for device, held in enumerate(device_groups()):
                for name in held:
                    where[name] = device
            self._device_groups = []
            for group in self.optimizer.param_groups:
                found = sorted({where[n] for p in group["params"] if (n := names.get(id(p))) in where})
                self._device_groups.append(found)
        return self._device_groups


def device_group_names(state: Mapping[str, Any]) -> list[list[str]]:
    """Each device param group's weight names, from a device ``state_dict()`` (its optimizer numbers
    the weights in ``param_names`` order, group after group)."""
    names: Sequence[str] = state.get("param_names") or []
    groups = ((state.get("optimizer") or {}).get("param_groups")) or []
    return [[names[i] for i in g.get("params", ()) if isinstance(i, int) and 0 <= i < len(names)] for g in groups]
