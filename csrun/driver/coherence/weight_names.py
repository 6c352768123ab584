"""The names a loaded program gave the model's weights, and what became of them by the next program.

A script may change its model's structure between programs (pruning's ``weight_orig``, a
parametrization's ``original``, a module replaced) and its trainable set (a layer frozen, later
unfrozen). When the device switches programs, the state it carries over must follow each weight,
not each name. :class:`WeightNames` notes every weight's and buffer's name by identity when a
program is loaded; at the switch :meth:`WeightNames.renames` says which names moved to another
name and which were given to a new tensor, and :meth:`WeightNames.carry_optimizer_state` gives a
weight that comes back to the trainable set the optimizer state it had when it last trained, as
eager's optimizer keeps it.
"""

from __future__ import annotations

from typing import Any

import torch

from csrun.driver import legacy_state


class WeightNames:
    """The loaded program's weight names by identity, and each weight's optimizer state by name."""

    def __init__(self) -> None:
        self._loaded: dict[int, str] = {}
        """The model's weights and buffers by ``id`` when the program was loaded: their names there."""
        self._optimizer_kept: dict[str, Any] = {}
        """Each weight's optimizer state, by name, as last carried over (a frozen weight's stays)."""

    def loaded(self, model: torch.nn.Module) -> None:
        """A program was loaded for ``model``: note its weights' and buffers' names."""
        self._loaded = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}

    def renames(self, model: torch.nn.Module | None) -> tuple[dict[str, str], set[str]]:
        """The loaded program's weight names whose weights the model now names otherwise (old ->
        new), and those whose name the model gave to another tensor since (a weight replaced:
        the model's new one is kept, as eager keeps it)."""
        if model is None:
            return {}, set()
        now = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}
        renames = {old: now[i] for i, old in self._loaded.items() if i in now and now[i] != old}
        taken = set(now.values())
        replaced = {old for i, old in self._loaded.items() if i not in now and old in taken}
        return renames, replaced

    def carry_optimizer_state(self, state: dict[str, Any], model: torch.nn.Module | None,
                              optimizer: torch.optim.Optimizer | None) -> None:
        """Remember each weight's optimizer state in ``state`` (the legacy state, changed in place)
        by name, and give a weight the device does not hold now (frozen, since unfrozen) the state
        it had when it last trained."""
        names = legacy_state.param_order(model, optimizer) or []
        slots = (state.get("optimizer") or {}).get("state")
        if not isinstance(slots, dict):
            return
        for index, name in enumerate(names):
            if index in slots:
                self._optimizer_kept[name] = slots[index]
            elif name in self._optimizer_kept:
                slots[index] = self._optimizer_kept[name]
