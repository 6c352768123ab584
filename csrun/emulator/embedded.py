"""The in-process emulator: an :class:`~csrun.emulator.engine.executor.Engine` on a worker thread.

Steps run asynchronously in submission order on one worker thread; ``submit`` returns a
:class:`StepHandle` at once and blocks only when ``queue_depth`` steps are already in flight.
State fetches and loads go through the same queue, so they happen at a step boundary. On the
CPU a training step's handle resolves as soon as its outputs exist, before the backward pass
and the update (a step closure waits for the values, not for the update; a state fetch still
waits for the whole step). The first failing step makes the device unusable: its handle
(unless its outputs were already handed out), every later handle and every later call raise
that error.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, TypeVar

import torch

from csrun.emulator.device import Device
from csrun.emulator.engine.executor import Engine, parse_device
from csrun.program.errors import DeviceError, StepFailed
from csrun.emulator.handles import StepHandle
from csrun.program.step_plan import FULL_STEP, StepPlan
from csrun.errors import UserError
from csrun.program.spec import ProgramSpec

log = logging.getLogger("csrun.emulator")
T = TypeVar("T")

_STOP = object()

EngineFactory = Callable[[torch.export.ExportedProgram, ProgramSpec], Any]
"""Builds the engine a device runs a loaded program on."""


def outputs_to_cpu(out: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Copy a step's outputs to CPU tensors (the step boundary)."""
    res: dict[str, torch.Tensor] = {}
    for k, v in out.items():
        res[k] = v.detach().to("cpu") if isinstance(v, torch.Tensor) else torch.as_tensor(v)
    return res


class EmbeddedDevice(Device):
    """The engine on a worker thread of this process."""

    def __init__(
        self,
        *,
        device: str = "cpu",
        queue_depth: int = 2,
        notice: Callable[[str], None] | None = None,
        engine_factory: EngineFactory | None = None,
    ) -> None:
        """``device``: cpu, cuda or cuda:i. ``queue_depth``: steps in flight before submit waits.
        ``engine_factory``: builds the engine for a loaded program (default: an
        :class:`~csrun.emulator.engine.executor.Engine` on ``device``; a cluster's stand-in,
        :mod:`csrun.emulator.swarm.device`, forwards to other tasks)."""
        if not isinstance(queue_depth, int) or queue_depth < 1:
            raise UserError(f"queue_depth must be a positive integer, got {queue_depth!r}")
        self.device = parse_device(device)
        self.queue_depth = queue_depth
        self._notice = notice
        self._engine_factory = engine_factory
        self._engine: Any = None
        self._jobs: "queue.Queue[Any]" = queue.Queue()
        self._slots = threading.Semaphore(queue_depth)
        self._error: BaseException | None = None
        self._closed = False
        self._submitted = 0
        self._last_step = 0
        self._lock = threading.Lock()
        self._worker = threading.Thread(target=self._run, name="cs-emulator-engine", daemon=True)
        self._worker.start()

    # worker side -----------------------------------------------------------------------------

    def _run(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            kind, payload, future, number = job
            try:
                if self._error is not None:
                    raise self._error
                if self._closed:
                    raise DeviceError("the device was closed before this step ran")
                if kind == "step":
                    if self._engine is None:
                        raise UserError("no program loaded on the device: load a program before submitting steps")
                    batch, plan = payload
                    out = self._engine.run_step(batch, publish=self._publisher(future), plan=plan)
                    self._last_step = self._engine.step
                    if not future.done():
                        future.set_result(outputs_to_cpu(out))
                else:
                    future.set_result(payload())
            except BaseException as exc:  # noqa: BLE001 - the device must never die
                err = exc
                if kind == "step" and exc is not self._error and not self._closed:
                    # a failed step poisons the device: later steps would run on unknown state
                    if not isinstance(exc, UserError):
                        err = StepFailed(number, f"{type(exc).__name__}: {exc}")
                        err.__cause__ = exc
                        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                        log.error("step %d failed on the device: %s: %s", number, type(exc).__name__, first)
                        log.debug("step %d: the traceback", number, exc_info=exc)  # for a bug report, at debug level
                    self._error = err
                if not future.done():  # outputs already handed out: the error surfaces at the next call
                    future.set_exception(err)
            finally:
                if kind == "step":
                    self._slots.release()

    def _publisher(self, future: "Future[dict[str, torch.Tensor]]") -> Callable[[dict[str, Any]], None] | None:
        """Resolve a step's handle as soon as the engine has its outputs (before the update).

        CPU only: on CUDA the copy to the host would stall the worker until the forward has
        run on the GPU, before it could queue the backward.
        """
        if self.device.type != "cpu":
            return None
        return lambda out: future.set_result(outputs_to_cpu(out))

    def _call(self, fn: Callable[[], T]) -> T:
        self._raise_if_failed()
        fut: "Future[T]" = Future()
        self._jobs.put(("call", fn, fut, 0))
        return fut.result()

    def _raise_if_failed(self) -> None:
        if self._closed:
            raise DeviceError("the device is closed")
        if self._error is not None:
            raise self._error

    # caller side -----------------------------------------------------------------------------

    def load(self, program: torch.export.ExportedProgram, spec: ProgramSpec) -> None:
        """Build the engine for ``program`` on the worker (after pending steps)."""

        def build() -> None:
            self._engine = None
            if self._engine_factory is not None:
                self._engine = self._engine_factory(program, spec)
            else:
                self._engine = Engine(program, spec, self.device, notice=self._notice)
            self._last_step = 0

        self._call(build)

    def submit(self, batch: Any, plan: StepPlan = FULL_STEP) -> StepHandle:
        """Queue a step; waits only while ``queue_depth`` steps are in flight."""
        self._raise_if_failed()
        self._slots.acquire()
        try:
            self._raise_if_failed()
        except BaseException:
            self._slots.release()
            raise
        with self._lock:
            self._submitted += 1
            number = self._submitted
        fut: "Future[dict[str, torch.Tensor]]" = Future()
        self._jobs.put(("step", (batch, plan), fut, number))
        return StepHandle(number, fut)

    def state_dict(self) -> dict[str, Any]:
        """The full device state on CPU, after all submitted steps."""

        def fetch() -> dict[str, Any]:
            if self._engine is None:
                raise UserError("no program loaded on the device")
            return self._engine.state_dict()

        return self._call(fetch)

    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True, load_optimizer: bool = True) -> None:
        """Load a fetched state onto the device, after all submitted steps."""

        def put() -> None:
            if self._engine is None:
                raise UserError("no program loaded on the device")
            self._engine.load_state_dict(state, strict=strict, load_optimizer=load_optimizer)
            self._last_step = self._engine.step

        self._call(put)

    def synchronize(self) -> None:
        """Wait for all submitted steps; raise the first error."""
        self._call(lambda: None)

    @property
    def global_step(self) -> int:
        """Global step after the steps finished so far."""
        return self._last_step

    def close(self) -> None:
        """Abandon pending steps and stop the worker (waits for a running step to end)."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(_STOP)
        if threading.current_thread() is not self._worker:
            self._worker.join()
        self._engine = None
