"""Weights and buffers the script changes on the host between steps reach the device before the next step.

Scripts edit weights between steps: WGAN's ``p.data.clamp_(-c, c)``, a row of an embedding
re-initialised under ``torch.no_grad()``, running statistics reset, the same in a step closure
or through the 2.x API. The user's tensors are the host copies of the device's
(:mod:`csrun.driver.state_view` brings them up to date when the script reads them), so
:class:`HostWeights` watches them:

* **An edit is seen** by the tensor's version counter (any in-place change through the tensor
  or a view of it, ``no_grad`` or not) or, once the script has read the weights through the
  model (which is how it gets hold of them), by comparing them with what it read (``.data``
  shares the storage but not the counter).
* **Before the step's first model call** (:meth:`HostWeights.before_step`) the edits made since
  the last step are taken, and the driver writes them to the device before that step runs
  (:meth:`HostWeights.take`), after every step sent before it: the device trains the edited
  weights, as eager PyTorch does.
* **An edit the device cannot place is refused**, naming the weight: one made during a step
  (after its first model call: eager's forward ran on the old value, its update would apply
  to the new one), and one made to a copy that was out of date (the device had trained it
  since the script last read it: eager would have edited the trained value, which the host
  copy never held).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import torch

from csrun.errors import UserError


class HostEditError(UserError):
    """A weight or buffer was changed on the host where the device cannot follow."""


_FIX = ("change weights between steps, before the step's model(batch) (or in a step closure), after reading them "
        "through the model (model.parameters(), model.state_dict(), model.layer.weight), which brings the host "
        "copy up to date")


class HostWeights:
    """The wrapped model's weights and buffers against what the device holds (see the module manual)."""

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self._held: list[tuple[str, torch.Tensor]] = []
        """The model's weights and buffers as of the last sync (a new tensor object recompiles first)."""
        self._versions: dict[str, int] = {}
        self._version_list: list[int] = []
        self._read: dict[str, torch.Tensor] | None = None
        """The values the script last read (a refresh from the device), to compare contents with."""
        self._pending: dict[str, torch.Tensor] = {}
        self._active = False
        """A program is loaded: the device holds its own copy."""
        self._current = False
        """The host copies hold the device's values as of the last step sent (nothing ran since a read)."""

    def attach(self, model: torch.nn.Module) -> None:
        """Watch ``model``'s weights and buffers."""
        self.model = model

    def _tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        assert self.model is not None  # noqa: S101 - attached before a program is loaded
        yield from self.model.named_parameters()
        yield from self.model.named_buffers()

    def synced(self, values: Mapping[str, torch.Tensor] | None, *, current: bool) -> None:
        """The host copies and the device agree now: a program was loaded from them, a state was
        loaded into both, or the copies were refreshed from the device (``values``: what they read,
        kept to compare with). ``current``: no step has run on the device since."""
        self._active = self.model is not None
        if not self._active:
            return
        self._held = list(self._tensors())
        self._versions = {name: t._version for name, t in self._held}
        self._version_list = [t._version for _, t in self._held]
        self._read = dict(values) if values is not None else None
        self._current = current

    def own_change(self) -> None:
        """csrun itself ran the model on the host copies and put their values back (the recording's
        run for shapes, the compile's trace): their versions moved, their values did not."""
        if self._active:
            self._versions = {name: t._version for name, t in self._held}
            self._version_list = [t._version for _, t in self._held]

    def sent(self, trains: bool) -> None:
        """A step was sent to the device; a training step makes the host copies out of date."""
        if trains:
            self._current = False
            self._read = None

    def _edited(self) -> list[str]:
        if not self._active:
            return []
        if self._read is None and [t._version for _, t in self._held] == self._version_list:
            return []  # the common step: one pass over the version counters
        edited = []
        read = self._read
        for name, t in self._held:
            if t._version != self._versions.get(name, t._version):
                edited.append(name)
            elif read is not None:
                was = read.get(name)
                if was is not None and was.shape == t.shape and not torch.equal(t.detach(), was.to(t.dtype)):
                    edited.append(name)
        return edited

    def check_current(self) -> None:
        """Before the host copies are refreshed (overwritten) from the device: none was edited while
        out of date (the refresh would drop the edit; eager made it on the trained value)."""
        edited = self._edited()
        if edited and not self._current:
            raise HostEditError(f"{_list(edited)} changed on the host while its copy there was out of date (the "
                                f"device had trained it since the script last read it): {_FIX}")

    def before_step(self) -> None:
        """At the step's first model call: the edits since the last step, kept to write first."""
        edited = self._edited()
        if not edited:
            return
        if not self._current:
            raise HostEditError(f"{_list(edited)} changed on the host while its copy there was out of date (the "
                                f"device had trained it since the script last read it): {_FIX}")
        own = dict(self._held)
        for name in edited:
            self._pending[name] = own[name].detach().clone()
            self._versions[name] = own[name]._version
            if self._read is not None:
                self._read[name] = self._pending[name]
        self._version_list = [t._version for _, t in self._held]

    def take(self) -> dict[str, torch.Tensor]:
        """At the step's boundary, before it is sent: the edits to write to the device first (made
        before its first model call); an edit made during the step is refused."""
        edited = self._edited()
        if edited:
            raise HostEditError(f"{_list(edited)} changed on the host during the step (after its model call): "
                                f"eager PyTorch ran that step's forward on the old value; {_FIX}")
        pending, self._pending = self._pending, {}
        return pending

    def flush(self) -> dict[str, torch.Tensor]:
        """Between steps (a state is taken, the Session ends): the edits made since the last step."""
        self.before_step()
        pending, self._pending = self._pending, {}
        return pending


def _list(names: list[str]) -> str:
    """``the model's 'a', 'b' and 3 more`` for messages."""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return "the model's " + ", ".join(f"'{n}'" for n in names[:3]) + more


def split_state(model: torch.nn.Module, values: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """A device state holding ``values`` (weights and buffers by name), for ``load_state_dict(strict=False,
    load_optimizer=False)``."""
    buffers = {name for name, _ in model.named_buffers()}
    return {"params": {n: v for n, v in values.items() if n not in buffers},
            "buffers": {n: v for n, v in values.items() if n in buffers}}
