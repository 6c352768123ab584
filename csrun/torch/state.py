"""Process-wide state of the user API: who this task is, the device backend, the session.

``initialize()`` fills it; every other call fills it with defaults on first use, so a
script that never calls ``initialize()`` still runs (on the CPU). Nothing here touches MPI
unless the job has more than one task; :func:`comm` imports mpi4py on first use.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass, field
from typing import Any

from csrun.cluster import ClusterInfo, cluster_info
from csrun.errors import UserError
from csrun.torch.backend import Backend, DeviceOptions, EagerBackend, StepClosure, device_factory


class InitializeError(UserError):
    """``initialize()`` was asked for something this run cannot do."""


@dataclass(kw_only=True)
class State:
    """Everything the user API remembers between calls."""

    info: ClusterInfo
    """This task's place in the job."""
    options: DeviceOptions = field(default_factory=DeviceOptions)
    """What ``initialize()`` was told."""
    backend: Backend = field(default_factory=EagerBackend)
    """Runs the chief's steps."""
    closures: list[StepClosure] = field(default_factory=list)
    """Step closures queued in the current step."""
    session: Any = None
    """The chief's active Session, if any."""
    streamed: bool = False
    """A session has started (or released) the streamers; they are gone after it."""

    @property
    def streaming(self) -> bool:
        """True when this job has streamers (more than one task)."""
        return self.info.num_tasks > 1


_state: State | None = None


def state() -> State:
    """The state, created with defaults on first use."""
    global _state
    if _state is None:
        _state = State(info=cluster_info())
        if _state.streaming and _state.info.is_chief:
            atexit.register(_release_unstarted)
    return _state


def initialize(cs_ip: str | None = None, *, compile_only: bool = False, validate_only: bool = False,
               backend: Backend | None = None) -> State:
    """Set up this task: its role from the launcher's environment and, on the chief, the device.

    ``cs_ip`` (``HOST[:PORT]``, port 9000 when left out), ``compile_only`` or
    ``validate_only`` select the device path: the chief then asks the registered device
    backend factory for its backend (see :mod:`csrun.torch.backend`). Without them the
    chief runs eagerly on the CPU. ``backend`` installs a backend directly (tests, tools).
    """
    st = state()
    if compile_only and validate_only:
        raise InitializeError("Please set one of compile_only and validate_only")
    if cs_ip is not None:
        cs_ip = str(cs_ip).strip()
        if not cs_ip:
            raise InitializeError("cs_ip is empty: give HOST:PORT, or leave it out to run on the CPU")
        if ":" not in cs_ip:
            cs_ip += ":9000"
    st.options = DeviceOptions(cs_ip=cs_ip, compile_only=compile_only, validate_only=validate_only)
    if backend is not None:
        st.backend = backend
    elif st.info.is_chief and (cs_ip or compile_only or validate_only):
        factory = device_factory()
        if factory is None:
            raise InitializeError("no device backend is installed in this csrun: run without "
                                  "cs_ip / compile_only / validate_only to run on the CPU")
        st.backend = factory(st.options)
    return st


def comm() -> Any:
    """``MPI.COMM_WORLD`` (imports mpi4py on first call)."""
    from csrun.stream.wire import mpi

    return mpi().COMM_WORLD


def _release_unstarted() -> None:
    """At exit on the chief: free streamers that wait in a Session the chief never opened."""
    st = _state
    if st is None or st.streamed:
        return
    try:
        from csrun.stream.receiver import Receiver

        Receiver(comm(), list(range(1, st.info.num_tasks)), timeout=1.0).stop_unstarted()
    except Exception:  # exiting anyway; the launcher cleans up
        pass


def reset_for_tests() -> None:
    """Forget the state (unit tests only)."""
    global _state
    _state = None
