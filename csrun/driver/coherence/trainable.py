"""Which weights train, and in which param groups: a change recompiles the step, with one notice.

Gradual unfreezing (``model.encoder.requires_grad_(True)`` at an epoch's start), a weight frozen
mid-run, ``optimizer.add_param_group(...)``: eager PyTorch trains the new set from the next
backward on. The device's program was compiled for a trainable set and its groups, so
:class:`TrainableSet` compares them, at the step's first model call, with those the program was
compiled for; a change compiles the step again (the weights and the optimizer state carried
over), with one notice naming what changed and the line that changed it where csrun saw it
(``Module.requires_grad_``, ``add_param_group``). A change during a step (after its first model
call) is refused: eager's forward already ran with the old set.
"""

from __future__ import annotations

from typing import Any

import torch

from csrun.compiler.errors import Location, at
from csrun.compiler.locate import caller_location
from csrun.errors import UserError


class TrainableSetChanged(UserError):
    """The trainable weights or the optimizer's groups changed in the middle of a step."""


def fingerprint(modules: list[torch.nn.Module], optimizer: torch.optim.Optimizer | None) -> tuple[Any, ...]:
    """Which weights of ``modules`` (the model's) train, and which weights each param group holds
    (every step: a walk of the modules' own parameter dicts, not ``model.parameters()``'s)."""
    params = [p for m in modules for p in m._parameters.values() if p is not None]
    groups = tuple(tuple(map(id, g["params"])) for g in optimizer.param_groups) if optimizer is not None else ()
    return tuple(map(id, params)), tuple([p.requires_grad for p in params]), groups


class TrainableSet:
    """The trainable set and groups a program was compiled for (see the module manual)."""

    def __init__(self) -> None:
        self._compiled: tuple[Any, ...] | None = None
        self._seen: tuple[Any, ...] | None = None
        self.where: Location | None = None
        """The last line csrun saw change the set (``requires_grad_`` on a module, ``add_param_group``)."""

    def changed_at(self) -> None:
        """The script called ``Module.requires_grad_`` or ``add_param_group``: remember its line."""
        self.where = caller_location()

    def loaded(self, now: tuple[Any, ...]) -> None:
        """A program was compiled for the set ``now`` (:func:`fingerprint`)."""
        self._compiled = self._seen = now

    def before_step(self, now: tuple[Any, ...]) -> bool:
        """At the step's first model call: whether the set differs from the compiled one."""
        self._seen = now
        return self._compiled is not None and now != self._compiled

    def at_boundary(self, now: tuple[Any, ...]) -> None:
        """At the step's boundary: refused when it changed after the step's first model call."""
        if self._seen is not None and now != self._seen:
            raise TrainableSetChanged(
                f"{at(self.where)}the trainable weights or the optimizer's param groups changed during the step (after "
                "its model call): eager PyTorch ran that step's forward with the old set; change them between steps, "
                "before the step's model(batch)")

    def describe(self, model: torch.nn.Module, before: tuple[Any, ...] | None = None) -> str:
        """What changed since the compiled set, for the recompile notice."""
        old = before if before is not None else self._compiled
        was = dict(zip(old[0], old[1])) if old else {}
        seen = list(zip(self._seen[0], self._seen[1])) if self._seen else []
        names = {id(p): n for n, p in model.named_parameters()}
        started = [names[i] for i, t in seen if t and not was.get(i, False) and i in names]
        stopped = [names[i] for i, t in seen if not t and was.get(i, False) and i in names]
        parts = []
        if started:
            parts.append(f"{_few(started)} now train{'s' if len(started) == 1 else ''}")
        if stopped:
            parts.append(f"{_few(stopped)} no longer train{'s' if len(stopped) == 1 else ''}")
        if old and self._seen and old[2] != self._seen[2]:
            parts.append(f"the optimizer has {len(self._seen[2])} param groups (compiled with {len(old[2])})"
                         if len(old[2]) != len(self._seen[2]) else "the optimizer's param groups hold other weights")
        return "; ".join(parts) or "the trainable set changed"


def _few(names: list[str]) -> str:
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(f"'{n}'" for n in names[:3]) + more
