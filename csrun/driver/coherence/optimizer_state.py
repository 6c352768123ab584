"""The optimizer's per-weight state on the host shows the device's, and what the script changes in it reaches the device.

On the device the optimizer's state (SGD's ``momentum_buffer``, Adam's ``exp_avg``,
``exp_avg_sq`` and ``step``) lives with the device's weights. Scripts read it (logging
``opt.state[p]["exp_avg"].norm()``) and change it (``opt.state.clear()`` to restart Adam,
zeroing a momentum buffer after a warm-up). :class:`DeviceOptimizerState` is the wrapped
optimizer's ``state``: a read brings it up to date from the device first (when the device has
run steps since: the same rule as the weights, :mod:`csrun.driver.state_view`), and
:meth:`DeviceOptimizerState.edited` says, at the next step, whether the script changed it since
(an entry added, removed or cleared, a tensor changed in place), so the driver writes it to the
device before that step. A change made to an out-of-date copy is refused, naming it.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterator, Mapping

import torch

from csrun.driver.coherence.host_weights import HostEditError

_FIX = ("change the optimizer's state between steps, before the step's model(batch) (or in a step closure), after "
        "reading it (opt.state[p] brings it up to date)")


class DeviceOptimizerState(collections.defaultdict):  # type: ignore[type-arg]
    """``optimizer.state`` on the device path (see the module manual)."""

    def __init__(self, fetch: Callable[[], Mapping[int, Mapping[str, Any]] | None],
                 params: Callable[[], list[torch.Tensor]], entries: Mapping[Any, Any] | None = None) -> None:
        """``fetch``: the device's state by the host optimizer's parameter numbering (None: none
        loaded); ``params``: the optimizer's parameters in that numbering; ``entries``: what the
        host state held so far."""
        super().__init__(dict, entries or {})
        self._fetch, self._params = fetch, params
        self._seen: tuple[Any, ...] | None = None
        self._current = True
        """The host entries hold the device's values as of the last step sent."""
        self._quiet = 0

    # -- reads bring it up to date -------------------------------------------------------------

    def refresh(self) -> None:
        """Copy the device's state into the host entries (in place where a tensor is there) when
        the device ran steps since; a change made meanwhile is refused first."""
        if self._quiet or self._current:
            return
        self._quiet += 1
        try:
            if self._seen is not None and self._signature() != self._seen and not self._current:
                raise HostEditError(f"the optimizer's state changed on the host while its copy there was out of date "
                                    f"(the device had trained since the script last read it): {_FIX}")
            device = self._fetch()
            if device is None:
                return
            params = self._params()
            for index, slots in device.items():
                if index >= len(params):
                    continue
                own = dict.setdefault(self, params[index], {})
                for key, value in slots.items():
                    held = own.get(key)
                    if isinstance(held, torch.Tensor) and isinstance(value, torch.Tensor) and held.shape == value.shape:
                        with torch.no_grad():
                            held.copy_(value.to(held.dtype))
                    else:
                        own[key] = value.clone() if isinstance(value, torch.Tensor) else value
            self._seen = self._signature()
            self._current = True
        finally:
            self._quiet -= 1

    def sent(self) -> None:
        """A training step was sent: the host entries are out of date until read again."""
        self._current = False

    def synced(self) -> None:
        """The host entries and the device agree now (written, or loaded into both)."""
        self._seen = self._signature()
        self._current = True

    def edited(self) -> bool:
        """Whether the script changed the entries since they were last synced; refused when it
        changed an out-of-date copy."""
        if self._seen is None or self._signature() == self._seen:
            return False
        if not self._current:
            raise HostEditError(f"the optimizer's state changed on the host while its copy there was out of date: {_FIX}")
        return True

    def _signature(self) -> tuple[Any, ...]:
        """Which weights have entries, each entry's keys, and each tensor's identity and version."""
        return tuple((id(p), tuple((k, id(v), v._version) if isinstance(v, torch.Tensor) else (k, v)
                                   for k, v in slots.items()))
                     for p, slots in dict.items(self))

    # -- the dict's reads ----------------------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        self.refresh()
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.refresh()
        return super().__contains__(key)

    def __iter__(self) -> Iterator[Any]:
        self.refresh()
        return super().__iter__()

    def __len__(self) -> int:
        self.refresh()
        return super().__len__()

    def get(self, key: Any, default: Any = None) -> Any:  # noqa: D102 - dict's
        self.refresh()
        return super().get(key, default)

    def keys(self) -> Any:  # noqa: D102 - dict's
        self.refresh()
        return super().keys()

    def values(self) -> Any:  # noqa: D102 - dict's
        self.refresh()
        return super().values()

    def items(self) -> Any:  # noqa: D102 - dict's
        self.refresh()
        return super().items()

    # -- its writes: on the current values (a write to an out-of-date copy would be lost) --------

    def __setitem__(self, key: Any, value: Any) -> None:
        self.refresh()
        super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        self.refresh()
        super().__delitem__(key)

    def clear(self) -> None:  # noqa: D102 - dict's
        self.refresh()
        super().clear()

    def pop(self, key: Any, *default: Any) -> Any:  # noqa: D102 - dict's
        self.refresh()
        return super().pop(key, *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:  # noqa: D102 - dict's
        self.refresh()
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:  # noqa: D102 - dict's
        self.refresh()
        super().update(*args, **kwargs)

    def __reduce__(self) -> Any:
        return collections.defaultdict, (dict, dict(dict.items(self)))

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        import copy

        return collections.defaultdict(dict, copy.deepcopy(dict(dict.items(self)), memo))
