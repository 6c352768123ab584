"""``cbtorch.state()``: the R1.x runtime-state object, as far as csrun has one.

R1.x model-zoo code reaches into it in a few set ways, and those run unchanged:

* ``state.full_config.<section>.<knob> = value`` (a model's ``set_custom_stack_params``:
  ``full_config.matching.kernel.enable_pipelined_mlm_loss = True``,
  ``full_config.placement.optimize_buses.deltat_relative_margin = 0.5``): the system's
  compiler knobs. csrun's compiler has none of them, so each assignment is **recorded and
  ignored**, with one notice line on the chief per knob (``csrun: cbtorch.state().full_config.
  matching.kernel.enable_pipelined_mlm_loss = True: csrun's compiler has no such knob;
  recorded, not used``); :meth:`FullConfig.as_dict` gives what was set. Reading a knob that
  was never set gives an empty section, as the system's default config tree would.
* ``state.is_inside_execution_loop``: True while a Session is open on this task.
* ``state.register_metric(metric)`` / ``state.metrics``: metric objects registered by code
  that keeps its own list.
* ``state.track_object(obj)``: accepted; csrun captures the whole step, so nothing needs
  tracking (returns None).
* ``state.init_tracker.entry(name)``: a context manager that does nothing.
* ``state.rate_tracker``: None (the legacy runners then log a plain "Training completed");
  csrun's throughput is in the Session's report and ``performance.json``.

Anything else on the object is an ``AttributeError`` naming what csrun's state has.
One object per process (:func:`state`).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from csrun.torch.process_state import state as _process_state


class FullConfig:
    """One section of the system's compiler config tree: any attribute path can be set (and
    is recorded) or read (an unset one is an empty section)."""

    def __init__(self, path: str = "full_config", root: "FullConfig | None" = None) -> None:
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_root", root)
        object.__setattr__(self, "_children", {})
        object.__setattr__(self, "_values", {})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        values: dict[str, Any] = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        children: dict[str, FullConfig] = object.__getattribute__(self, "_children")
        if name not in children:
            children[name] = FullConfig(f"{self._path}.{name}", self._root or self)
        return children[name]

    def __setattr__(self, name: str, value: Any) -> None:
        self._values[name] = value
        (self._root or self)._notice(f"{self._path}.{name}", value)

    def _notice(self, path: str, value: Any) -> None:
        said: set[str] = self.__dict__.setdefault("_said", set())
        if path in said:
            return
        said.add(path)
        if _process_state().info.rank == 0:
            sys.stderr.write(f"csrun: cbtorch.state().{path} = {value!r}: csrun's compiler has no such knob; "
                             "recorded, not used\n")
            sys.stderr.flush()

    def as_dict(self) -> dict[str, Any]:
        """Every value set below this section, as a nested dict."""
        out: dict[str, Any] = {name: child.as_dict() for name, child in self._children.items() if child.as_dict()}
        out.update(self._values)
        return out

    def __repr__(self) -> str:
        return f"<{self._path} {self.as_dict()!r}>"


class InitTracker:
    """``state.init_tracker``: its ``entry(name)`` blocks do nothing."""

    @contextlib.contextmanager
    def entry(self, name: str) -> Iterator[None]:
        """A block of model set-up named ``name`` (timed by the system; nothing here)."""
        yield


class StackState:
    """What ``cbtorch.state()`` returns (module manual)."""

    def __init__(self) -> None:
        self.full_config = FullConfig()
        """The compiler knobs a script set (recorded, not used)."""
        self.metrics: list[Any] = []
        """Metric objects given to :meth:`register_metric`."""
        self.init_tracker = InitTracker()
        """``init_tracker.entry(name)`` blocks."""
        self.rate_tracker: Any = None
        """None: csrun reports throughput in the Session's report and performance.json."""

    @property
    def is_inside_execution_loop(self) -> bool:
        """True while a Session is open on this task."""
        return _process_state().session is not None

    def register_metric(self, metric: Any) -> None:
        """Keep ``metric`` in :attr:`metrics`."""
        self.metrics.append(metric)

    def track_object(self, obj: Any) -> None:
        """Accepted and dropped: csrun captures the whole step, so nothing needs tracking."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"cbtorch.state() has no {name!r} in csrun; it has full_config (compiler knobs, recorded "
                             "and ignored), is_inside_execution_loop, register_metric, metrics, track_object, "
                             "init_tracker and rate_tracker (None)")


_STATE: StackState | None = None


def state() -> StackState:
    """This process's :class:`StackState` (``cbtorch.state()``)."""
    global _STATE
    if _STATE is None:
        _STATE = StackState()
    return _STATE


def reset_for_tests() -> None:
    """Forget the process's StackState (tests only)."""
    global _STATE
    _STATE = None
