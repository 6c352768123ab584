"""Process-wide state of the user API: who this task is, the device backend, the session.

``initialize()`` fills it; every other call fills it with defaults on first use, so a
script that never calls ``initialize()`` still runs (on the CPU). Nothing here touches MPI
unless the job has more than one task; :func:`comm` imports mpi4py on first use.
"""

from __future__ import annotations

import atexit
import sys
from dataclasses import dataclass, field
from typing import Any, NoReturn

from csrun.cluster import ClusterInfo, allocation_notice, cluster_info
from csrun.compiler.settings import CompileSettings
from csrun.consoles import whole_lines
from csrun.driver.options import verify_every as checked_verify_every
from csrun.driver.options import verify_steps as checked_verify_steps
from csrun.driver.run_path import RunFlags, RunPathError, decide
from csrun.errors import UserError
from csrun.stream.receiver import Receiver
from csrun.stream.sender import run_streamer
from csrun.stream.source import BatchSource
from csrun.stream.wire import group_communicator, mpi
from csrun.torch.gc_policy import hold_setup_objects, release_setup_objects
from csrun.driver.cluster_steps import release_cluster
from csrun.torch.backend import Backend, DeviceOptions, EagerBackend, StepClosure, device_factory


class InitializeError(RunPathError):
    """``initialize()`` was asked for something this run cannot do (a path error is one too)."""


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
        return self.info.input_tasks > 1


_state: State | None = None


def state() -> State:
    """The state, created with defaults on first use."""
    global _state
    if _state is None:
        _state = State(info=cluster_info())
        notice = allocation_notice(_state.info)
        if notice is not None:
            print(notice, file=sys.stderr, flush=True)
        if _state.streaming and _state.info.is_chief:
            atexit.register(_release_unstarted)
        if _state.info.swarm_tasks and _state.info.is_chief:
            atexit.register(release_cluster)  # the systems and MemoryX wait for the chief's word to leave
    return _state


def initialize(cs_ip: str | None = None, *, compile_only: bool = False, validate_only: bool = False,
               settings: CompileSettings | None = None, model_dir: str | None = None, compile_dir: str | None = None,
               device: str = "cpu", queue_depth: int = 2, backend: Backend | None = None, cpu: bool = False,
               verify_steps: int | None = None, verify_every: int | None = None) -> State:
    """Set up this task: its role from the launcher's environment and, on the chief, the path.

    The path (device or CPU) follows the table in :mod:`csrun.driver.run_path`, from the
    arguments and this task's :class:`~csrun.cluster.ClusterInfo` (``CS_IP``, the launcher);
    conflicting flags raise :class:`InitializeError`, a bad address
    :class:`~csrun.address.AddressError`. On the device
    path the chief asks the registered device backend factory for its backend (see
    :mod:`csrun.torch.backend`); otherwise it runs eagerly on the CPU, applying the device's
    training semantics when ``settings`` (a :class:`~csrun.compiler.CompileSettings`) are
    given. ``cpu=True`` forces eager CPU over ``CS_IP`` and the launcher (run.py's ``--cpu``,
    ``cstorch.backend("CPU")``). ``model_dir``/``compile_dir`` say where compiles go; ``device`` is the embedded
    emulator's torch device; ``queue_depth`` how many steps the chief may run ahead;
    ``verify_steps`` how many steps of each program the device checks against eager PyTorch
    (:mod:`csrun.driver.verify`; None: ``CSRUN_VERIFY_STEPS``, default 1), ``verify_every`` one
    step in how many later (None: ``CSRUN_VERIFY_EVERY``, default 0: none).
    ``backend`` installs a backend directly (tests, tools). From here on each line the process
    prints is one write (:func:`~csrun.consoles.whole_lines`: a job's tasks share one stream).
    """
    whole_lines()
    st = state()
    try:
        path = decide(RunFlags(cs_ip=cs_ip, cpu=cpu, compile_only=compile_only, validate_only=validate_only),
                      st.info)
    except RunPathError as exc:
        raise InitializeError(str(exc)) from None
    if isinstance(queue_depth, bool) or not isinstance(queue_depth, int) or queue_depth < 1:
        raise InitializeError(f"queue_depth must be a positive integer, got {queue_depth!r}")
    try:
        steps = checked_verify_steps(verify_steps)
        every = checked_verify_every(verify_every)
    except UserError as exc:
        raise InitializeError(str(exc)) from None
    st.options = DeviceOptions(path=path, settings=settings, model_dir=model_dir, compile_dir=compile_dir,
                               device=device, queue_depth=queue_depth, job_id=st.info.job_id, verify_steps=steps,
                               verify_every=every,
                               num_csx=st.info.num_csx)
    if backend is not None:
        st.backend = backend
    elif st.info.is_chief and st.options.uses_device:
        factory = device_factory()
        if factory is None:
            raise InitializeError("no device backend is installed in this csrun: run without "
                                  "cs_ip / compile_only / validate_only to run on the CPU")
        st.backend = factory(st.options)
    else:
        st.backend = EagerBackend(settings)
    hold_setup_objects(strict=st.info.is_chief)  # csrun.torch.gc_policy: imports done, the model comes next
    return st


_input_comm: Any = None


def comm() -> Any:
    """``MPI.COMM_WORLD`` (imports mpi4py on first call): the stream's point-to-point messages name
    world ranks (:attr:`~csrun.cluster.ClusterInfo.streamer_ranks`)."""
    return mpi().COMM_WORLD


def input_comm() -> Any:
    """The input group's communicator for the user API's collectives: the chief (rank 0) and the
    streamers (1..S); ``MPI.COMM_WORLD`` unless the job is a cluster of systems, whose tasks take
    part in none. Made at its first collective (``MPI_Comm_create_group``: the input tasks only)."""
    global _input_comm
    world = comm()
    info = state().info
    if not info.swarm_tasks:
        return world
    if _input_comm is None:
        _input_comm = group_communicator(world, [0, *info.streamer_ranks])
    return _input_comm


def stream_and_exit(source: BatchSource) -> NoReturn:
    """A streamer's whole part: serve ``source`` to the chief until it says stop (or STOP at once,
    when the chief never opens a Session), then leave MPI and exit 0."""
    st = state()
    st.streamed = True
    hold_setup_objects(strict=False)  # the process ends with the stream: nothing to give back
    run_streamer(comm(), source, node=st.info.node_name)
    MPI = mpi()
    if not MPI.Is_finalized():
        MPI.Finalize()
    sys.stdout.flush()
    sys.exit(0)


def _release_unstarted() -> None:
    """At exit on the chief: free streamers that wait in a Session the chief never opened."""
    st = _state
    if st is None or st.streamed:
        return
    try:
        Receiver(comm(), st.info.streamer_ranks, timeout=1.0).stop_unstarted()
    except Exception:  # exiting anyway; the launcher cleans up
        pass


def reset_for_tests() -> None:
    """Forget the state (unit tests only)."""
    global _state
    release_setup_objects(True)  # a test's initialize (or Session) froze the heap: the next test starts unfrozen
    if _state is not None and hasattr(_state.backend, "close"):
        _state.backend.close()
    _state = None
