"""The device driver: one object that owns compile -> program -> device -> step execution.

:class:`DeviceDriver` is the user API's device backend (it implements
:class:`csrun.torch.backend.Backend`; ``initialize()`` builds one on the chief when the run path
is not the CPU):

* :meth:`~DeviceDriver.next_step` is the step boundary, in one place: the step that ended is
  sent to the device, the next batch is fetched while the device runs it, the ended step's
  closures run, and the batch opens the next step (its tensors become step values).

* :meth:`~DeviceDriver.prepare_module` routes ``model(batch)`` to :meth:`~DeviceDriver.forward`;
  :meth:`~DeviceDriver.prepare_optimizer` turns ``step()`` / ``zero_grad()`` into order checks
  (:class:`~csrun.driver.steps.StepOrder`): the device runs backward, the optimizer, the
  learning-rate schedule, clipping and loss scaling itself.
* The first ``model(batch)`` of a mode opens the device (:func:`open_device`: embedded, or
  the server at the path's address, tried for ``CSRUN_CONNECT_TIMEOUT`` seconds, so a wrong
  address fails before any compile), then captures and compiles the step with
  :func:`csrun.compiler.flow.compile_only` (settings from the options, else
  ``CompileSettings()`` with the wrapped optimizer; the session's DataLoader, given at
  :meth:`~DeviceDriver.begin_session`, for the short-last-batch check; the legacy messages on stdout),
  raises the compile's problems and loads the program with the module's weights, applies a
  :class:`PendingState` and submits the batch. Later calls check the batch against the
  captured spec and submit it: the user's Python forward does not run again.
* ``model(batch)`` returns step values (:class:`~csrun.driver.step_values.StepValue`: the
  loss, or a dict like the forward's); the chief runs ahead up to ``queue_depth`` steps;
  closures read them at the step boundary (:class:`~csrun.driver.closures.ClosureRunner`).
* :meth:`~DeviceDriver.apply_settings` is the one channel for compile settings from either
  API (cstorch's training settings); a change after the step was compiled is refused.
* A ``compile_only`` / ``validate_only`` path compiles at the first ``model(batch)`` and
  raises ``SystemExit(0)`` on success, ``SystemExit(1)`` on failure.
* Switching modes (a train session, then eval) compiles the other program at its first
  batch and carries the device's weights over (:class:`LoadedProgram` says what is loaded);
  the training state is kept aside so a later train session resumes it.
* :meth:`~DeviceDriver.get_state` waits for the device and maps its state to the legacy keys
  (:mod:`csrun.driver.legacy_state`); :meth:`~DeviceDriver.set_state` loads onto the device,
  or keeps the state as a :class:`PendingState` until a program is loaded.

The device is closed by :meth:`DeviceDriver.close`, which is registered with :mod:`atexit`
when the driver opens a device (the emulator's worker thread or socket must not outlive
the interpreter).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import time
import types
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Iterator, Literal, Mapping, NoReturn

import torch
import torch.utils._pytree as pytree
from csrun.consoles import console as log_console
from torch.utils.data import DataLoader

from csrun.compiler.flow import CompileResult, compile_only, exit_code, load_program, settings_with_optimizer
from csrun.compiler.flow import validate_only as validate_step
from csrun.compiler.errors import at
from csrun.compiler.locate import caller_location
from csrun.compiler.python_state import PythonStateWatch
from csrun.compiler.settings import CompileSettings
from csrun.compiler.spec import ProgramSpec
from csrun.driver import clipping, index_dtypes, legacy_state
from csrun.driver.batch_dtypes import widened
from csrun.driver.clipping import Clip, ClippingError
from csrun.driver.hooks import backward_hook_in, optimizer_hooks_on
from csrun.driver.closures import ClosureRunner, StepClosure
from csrun.driver.coherence import Coherence
from csrun.driver.coherence.weight_names import WeightNames
from csrun.driver.compile_info import CompileInfo, from_result
from csrun.driver.options import DeviceOptions
from csrun.driver.run_path import PathKind
from csrun.driver.recorded_step import Recording
from csrun.driver.step_recording import StepRecorder
from csrun.driver.step_values import GRAD_NORM, StepValue
from csrun.driver.schedulers import SchedulerWatch
from csrun.driver.state_view import StateView, copy_into, mark_routed
from csrun.driver.steps import StepOrder
from csrun.driver.verify import StepCheck, StepFacts, Verifier, draws_random
from csrun.emulator.remote.auth_token import client_token
from csrun.emulator.remote.client import RemoteDevice
from csrun.emulator.remote.connect import connect_timeout
from csrun.emulator.device import Device
from csrun.emulator.embedded import EmbeddedDevice
from csrun.emulator.swarm.device import ClusterError, cluster_device
from csrun.driver.cluster_steps import ClusterSteps
from csrun.stream.wire import mpi
from csrun.program.step_plan import FULL_STEP, StepPlan
from csrun.errors import UserError
from csrun.stream.source import EPOCH_END

log = logging.getLogger("csrun.driver")

Mode = Literal["train", "eval"]


class DeviceUsageError(UserError):
    """The model or optimizer was used in a way the device path cannot run."""


class SettingsChangedError(UserError):
    """A compile setting changed after the step was compiled with the old one."""


@dataclass(frozen=True, kw_only=True)
class PendingState:
    """A legacy state to load once a program is on the device."""

    state: Mapping[str, Any]
    """The legacy ``{"model", "optimizer", "amp", "global_step"}`` state."""
    strict: bool
    """Every model key must match."""
    load_optimizer: bool
    """Load optimizer state and loss scaler too (else weights only)."""
    gradients_held: tuple[str, ...] | None = None
    """The weights whose gradient eager PyTorch holds (as zeros after ``zero_grad(set_to_none=False)``),
    carried from one training program to the next (None: none carried)."""


@dataclass(frozen=True, kw_only=True)
class LoadedProgram:
    """The program on the device."""

    mode: Mode
    """``train`` (forward + backward + optimizer) or ``eval`` (forward only)."""
    spec: ProgramSpec
    """The compiled spec."""
    step: str
    """The recorded step it runs (:meth:`~csrun.driver.recorded_step.Recording.signature`)."""


@dataclass(kw_only=True)
class OpenStep:
    """The step the loop is in: from its batch to its boundary."""

    mode: Mode
    batch: Any
    """The batch as the loader made it (CPU tensors): what is sent to the device."""
    recorder: StepRecorder
    implicit: bool
    """Opened by a model call outside the Session's batches (the call's arguments are the batch)."""
    extras: list[Any] | None = None
    """On a cluster: the step's batches for systems 2..N (:mod:`csrun.driver.cluster_steps`)."""
    calls: int = 0
    """Model calls so far."""


def open_device(options: DeviceOptions) -> Device:
    """The emulator this run uses: the server at the path's address, else embedded in this process."""
    if options.num_csx > 1:
        if options.path.address is not None:
            raise UserError(f"a cluster of {options.num_csx} systems runs on the job's own system tasks: "
                            f"--cs_ip / CS_IP ({options.path.address}) is not used with csrun_wse --num-csx; drop it")
        return cluster_device(comm=mpi().COMM_WORLD, num_csx=options.num_csx, queue_depth=options.queue_depth)
    if options.path.address is not None:
        return RemoteDevice(str(options.path.address), client_token(), options.job_id or str(os.getpid()),
                            queue_depth=options.queue_depth, connect_timeout=connect_timeout())
    return EmbeddedDevice(device=options.device, queue_depth=options.queue_depth)


_ROOT_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
               "_forward_hooks_always_called")
"""The wrapped model's own call hooks: they run around each ``model(...)`` in the loop (on step
values, so the recording holds what they do), not around the recorded step's replay."""


def _holds_step_values(obj: Any) -> bool:
    """Whether any tensor in ``obj`` (tuples, lists, dicts) is a step value."""
    return any(isinstance(leaf, StepValue) for leaf in pytree.tree_leaves(obj))


class DeviceDriver:
    """Compiles the step, loads the program, runs the steps on the device (see the module manual)."""

    name = "device"

    def __init__(self, options: DeviceOptions, *, device: Device | None = None) -> None:
        """``device``: an already open device (tests); else opened at the first load as ``options`` say."""
        self.options = options
        self.device = device
        self.session_loader: DataLoader | None = None
        """The running session's DataLoader (None outside one), for the compile's checks."""
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.mode: Mode = "train"
        """The session's mode (``train`` outside a session)."""
        self.loaded: LoadedProgram | None = None
        """The program on the device (None before the first step)."""
        self.compile_info: CompileInfo | None = None
        """The last compile's figures."""
        self.pending: PendingState | None = None
        """A state to load with the next program."""
        self.train_state: Mapping[str, Any] | None = None
        """The training state kept aside while an eval program is loaded."""
        self._train_held: tuple[str, ...] = ()
        """The gradients eager holds, kept aside with :attr:`train_state`."""
        self.weight_names = WeightNames()
        """The loaded program's weight names, followed across a structure change to the next program."""
        self.steps_taken = 0
        """Optimizer steps taken (plus a loaded state's): :meth:`global_step`."""
        self.order = StepOrder()
        self.closures = ClosureRunner()
        self.recorders: dict[Mode, StepRecorder] = {"train": StepRecorder(notice=log.warning),
                                                    "eval": StepRecorder(notice=log.warning)}
        """One per mode: records the mode's first step, checks the later ones."""
        for recorder in self.recorders.values():
            recorder.predraw = options.num_csx <= 1  # a cluster's systems draw their own
        self.open_step: OpenStep | None = None
        """The step the loop is in (None between steps)."""
        self.steps_begun = 0
        self._model_forward: Callable[..., Any] | None = None
        self.coherence = Coherence(notice=log.warning)
        """Keeps the device's copy of the host's state equal to it (:mod:`csrun.driver.coherence`)."""
        self.view = StateView(self, self.coherence)
        """Keeps the user's model and optimizer showing the device's state."""
        self.schedulers: SchedulerWatch | None = None
        """The torch LR schedulers built on the wrapped optimizer."""
        self._step_clip: Clip | None = None
        """The clipping the open step asked for."""
        self._marked: list[torch.Tensor] = []
        self._weight_ids: frozenset[int] = frozenset()
        """The wrapped model's weights (clipping calls on them are the step's)."""
        self.verifier = Verifier(options.verify_steps or 0, options.verify_every or 0)
        """Which steps are checked against eager PyTorch (:mod:`csrun.driver.verify`)."""
        self._random = False
        """The loaded program draws random numbers."""
        self._step_rates: list[float] | None = None
        """Each group's learning rate when the open step called ``optimizer.step()`` (while checking)."""
        self._atexit = False
        self.cluster = ClusterSteps(options.num_csx, log.warning) if options.num_csx > 1 else None
        """On a cluster of systems: gathers each step's N batches."""

    # -- wrapping the user's objects ----------------------------------------------------------

    def prepare_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Route ``model(...)`` calls to :meth:`forward`; the module is returned unchanged otherwise."""
        driver = self
        own = model.__dict__.get("forward")
        self._model_forward = own if own is not None else type(model).forward.__get__(model)

        def forward(*args: Any, **kwargs: Any) -> Any:
            return driver.forward(*args, **kwargs)

        mark_routed(forward)
        model.forward = forward  # instance attribute: nn.Module.__call__ finds it first
        own_zero_grad = model.zero_grad

        def zero_grad(set_to_none: bool = True) -> None:
            driver.order.zero_grad(set_to_none)
            driver._unmark()
            with driver.view.internal():  # csrun's own walk over the weights, not the script's read
                own_zero_grad(set_to_none)

        mark_routed(zero_grad)
        model.zero_grad = zero_grad  # type: ignore[method-assign]  # the device's gradients go too
        self.model = model
        self._weight_ids = frozenset(id(p) for p in model.parameters())
        clipping.attach(self)
        index_dtypes.install()  # int32 targets and indices, as the system's kernels took them
        watch = PythonStateWatch(model)  # from now on, assignments to its Python values are seen
        for recorder in self.recorders.values():
            recorder.watch = watch
        self.view.attach_model(model)
        self.coherence.attach_model(model)
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """``step()`` and ``zero_grad()`` become order checks (the device runs the optimizer)."""
        driver = self

        def step(self: torch.optim.Optimizer, closure: Any = None) -> None:
            if closure is not None:
                raise DeviceUsageError(f"{at(caller_location())}optimizer.step(closure): the closure runs the model "
                                       "again inside step() (LBFGS, SAM), but the device runs one forward and one "
                                       "backward per step; call the closure's body in the loop, then step()")
            self._opt_called = True  # type: ignore[attr-defined]  # what torch's schedulers look for
            driver.optimizer_step()

        def zero_grad(self: torch.optim.Optimizer, set_to_none: bool = True) -> None:
            driver.order.zero_grad(set_to_none)

        step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]  # schedulers must not wrap it again
        # bound methods, as torch's schedulers expect (they read step.__func__)
        optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]
        optimizer.zero_grad = types.MethodType(zero_grad, optimizer)  # type: ignore[method-assign]
        self.optimizer = optimizer
        self.schedulers = SchedulerWatch(optimizer)
        self.view.attach_optimizer(optimizer)
        self.coherence.attach_optimizer(optimizer, self._optimizer_slots)
        return optimizer

    @contextlib.contextmanager
    def _user_objects(self, recording: Recording) -> Iterator[None]:
        """While the compiler looks: the model's forward is the recorded step (replayed from the
        batch, the model's own forward for each call), the optimizer's step/zero_grad its own."""
        saved = []
        for obj, names in ((self.model, ("forward",)), (self.optimizer, ("step", "zero_grad"))):
            for name in names:
                if obj is not None and name in obj.__dict__:
                    saved.append((obj, name, obj.__dict__.pop(name)))
        if self.model is not None:  # the model's own hooks ran in the loop, around each call: the recording has them
            for name in _ROOT_HOOKS:
                saved.append((self.model, name, self.model.__dict__[name]))
                self.model.__dict__[name] = collections.OrderedDict()
        forward = self._model_forward
        if self.model is not None and forward is not None:
            self.model.__dict__["forward"] = recording.replay_forward(forward, self.model)  # past the structure watch
        try:
            yield
        finally:
            if self.model is not None:
                self.model.__dict__.pop("forward", None)
            for obj, name, value in saved:
                obj.__dict__[name] = value

    # -- session and step boundaries ----------------------------------------------------------

    # -- gradient clipping (csrun.driver.clipping.ClipTarget) -----------------------------------

    def owns(self, params: list[torch.Tensor]) -> bool:
        """Whether ``params`` are the wrapped model's weights."""
        return bool(self._weight_ids) and all(id(p) in self._weight_ids for p in params)

    def clip_gradients(self, clip: Clip, params: list[torch.Tensor]) -> Any:
        """``clip_grad_norm_`` / ``clip_grad_value_`` on the model's weights: the open training step
        clips its gradients on the device (the norm comes back as a device value)."""
        step = self.open_step
        if step is None or step.mode != "train" or self.order.phase != "backward":
            raise ClippingError(f"{at(clip.location)}{clip.kind} outside loss.backward() ... optimizer.step() of a "
                                "training step: the device clips the gradients its update applies; call it between "
                                "the two")
        self._refuse_clip(clip, params)
        self._step_clip = clip
        if clip.kind == clipping.NORM:
            return step.recorder.engine_value(GRAD_NORM, torch.Size([]), torch.float32)
        return None

    def _refuse_clip(self, clip: Clip, params: list[torch.Tensor]) -> None:
        """Refuse, at the call, a clipping whose eager result the device's would not equal."""
        where = at(clip.location)
        if self.model is None:
            raise DeviceUsageError("wrap the model with cbtorch.module(model) before clipping")
        trainable = {id(p) for p in self.model.parameters() if p.requires_grad}
        given = {id(p) for p in params if p.requires_grad}
        if given != trainable:
            raise ClippingError(f"{where}{clip.kind} on {len(given)} of the model's {len(trainable)} trainable weights: "
                                "the device clips all of them together; pass model.parameters()")
        held = {id(p) for g in self.optimizer.param_groups for p in g["params"]} if self.optimizer else trainable
        if clip.kind == clipping.NORM and trainable - held:
            raise ClippingError(f"{where}{clip.kind} over {len(trainable - held)} trainable weights the optimizer does "
                                "not update: eager PyTorch keeps adding up their gradients (optimizer.zero_grad() does "
                                "not clear them) and counts them in the norm; freeze them (requires_grad_(False))")
        if self.order.scaled and not self.order.unscaled:
            raise ClippingError(f"{where}{clip.kind} on loss-scaled gradients (no scaler.unscale_(optimizer) before "
                                "it): eager PyTorch clips the scaled gradients, the device the unscaled ones; call "
                                "scaler.unscale_(optimizer) before clipping (PyTorch's recipe)")
        if self._step_clip is not None:
            raise ClippingError(f"{where}{clip.describe()} after {self._step_clip.describe()} in the same step: the "
                                "device clips once per step, by norm or by value")

    def _step_plan(self) -> StepPlan:
        """At a training step's boundary: what the device runs after the forward (the step order's
        plan, with the step's clipping); only an update step clips, and not on top of the
        program's own clipping."""
        plan = self.order.end_step()
        clip, self._step_clip = self._step_clip, None
        if clip is None:
            return plan
        if not plan.update:
            raise ClippingError(f"{at(clip.location)}{clip.describe()} in a step without optimizer.step(): "
                                "the device clips the gradients of an update; clip right before optimizer.step()")
        settings = self.options.settings
        if settings is not None and (settings.max_gradient_norm or settings.max_gradient_value):
            raise ClippingError(f"{at(clip.location)}{clip.describe()} in the step and clipping in the "
                                "compile settings (max_gradient_norm / max_gradient_value): give one of them")
        return replace(plan, **clip.plan_fields())

    def _unmark(self) -> None:
        if self._marked:
            clipping.unmark_gradients(self._marked)
            self._marked = []

    def _on_backward(self) -> None:
        self.order.backward()
        step = self.open_step
        if step is not None and step.recorder.recording_step and self.model is not None:
            hook = backward_hook_in(self.model)
            if hook is not None:
                raise DeviceUsageError(f"{at(self.order.backward_at)}{hook} runs Python in the backward: the device "
                                       "runs the step's backward itself and would leave it out; clip with "
                                       "torch.nn.utils.clip_grad_norm_ / clip_grad_value_ (the step's clipping), "
                                       "or remove the hook")
            self._marked = clipping.mark_gradients(self.model.parameters())

    def begin_session(self, mode: str, loader: DataLoader | None = None) -> None:
        """Remember the mode (``eval``, else ``train``) and the session's DataLoader; the session's
        first step is recorded anew (its program is compiled, or found in the cache, at its
        boundary; the loaded one is kept when it is the same step)."""
        self.session_loader = loader
        self.mode = "eval" if mode == "eval" else "train"
        self.order.reset(self.mode)
        self._step_clip = None
        self.order.accumulates = self.options.settings is not None and self.options.settings.streaming
        self.recorders[self.mode].reset()
        if self.model is not None:
            self.model.train(self.mode == "train")

    def next_step(self, fetch: Callable[[], Any], ended: list[StepClosure] | None) -> Any:
        """The step boundary before a batch: send the step that ended (``ended``: its closures; None
        when no step ended) to the device, fetch the next batch while it runs, run the closures, and
        open the next step with the batch (its tensors become step values). Returns the batch as the
        step receives it, or ``EPOCH_END`` from ``fetch``."""
        if ended is not None and self.open_step is not None:
            self._dispatch()
        extras = None
        try:
            item = fetch()
            if self.cluster is not None and item is not EPOCH_END and not self.options.path.compiles_only:
                extras = self.cluster.gather(fetch)
                if extras is None:
                    item = EPOCH_END
        finally:
            if ended is not None:  # before the next step opens: a closure sees its own step's state
                self.closures.run(ended)
        if item is EPOCH_END:
            return item
        if self.open_step is not None:
            self._dispatch()
        wrapped = self._open(item, implicit=False)
        assert self.open_step is not None  # noqa: S101 - just opened
        self.open_step.extras = extras
        return wrapped

    def _open(self, batch: Any, *, implicit: bool) -> Any:
        batch = widened(batch)  # the session's batches and an implicit step's arguments alike
        recorder = self.recorders[self.mode]
        self.steps_begun += 1
        wrapped = recorder.begin(batch, self.steps_begun)
        self.open_step = OpenStep(mode=self.mode, batch=batch, recorder=recorder, implicit=implicit)
        return wrapped

    def end_step(self, closures: list[StepClosure]) -> None:
        """A step boundary with no next batch (the loop's end, ``mark_step``): send the open step to
        the device (step 1: compile first), then run its closures."""
        if self.open_step is not None:
            self._dispatch()
        self.closures.run(closures)

    def end_session(self, failed: bool) -> None:
        """Wait for async closures and the device; check the last step was complete."""
        try:
            self._end_session(failed)
        finally:
            self.session_loader = None

    def _end_session(self, failed: bool) -> None:
        self._unmark()
        self.view.after_update = False
        if failed:
            step, self.open_step = self.open_step, None
            if step is not None:
                step.recorder.abandon()  # the user's copies of its batch must not stay values of an open step
            with contextlib.suppress(BaseException):
                self.closures.settle()
            self.order.reset(self.mode)
            return
        if self.open_step is not None:
            self._dispatch()
        self.closures.settle()
        with self.view.internal():
            self._flush_edits()
        if self.device is not None and self.loaded is not None:
            self.device.synchronize()

    # -- the step -----------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """``model(...)``: recorded in the step's first batch, checked against it later (the
        user's Python forward runs on the CPU once, for shapes); returns step values."""
        step = self.open_step
        if step is not None and step.implicit and not _holds_step_values((args, kwargs)):
            self._dispatch()  # a model call on new CPU tensors outside a Session: the next step
            step = None
        if step is None:
            if self.cluster is not None and not self.options.path.compiles_only:
                raise ClusterError(f"{at(caller_location())}a model call outside the DataLoader's loop runs one batch, "
                                   f"but a cluster of {self.cluster.num_csx} systems takes one per system: take the "
                                   "batches from the csrun DataLoader in a Session (or run with one system)")
            if len(args) == 1 and not kwargs:
                args = (self._open(args[0], implicit=True),)
            else:
                args, kwargs = self._open((args, kwargs), implicit=True)
            step = self.open_step
            assert step is not None  # noqa: S101 - just opened
        if step.calls == 0:
            if step.mode == "train":
                self.order.forward(self.steps_begun)
            with self.view.internal():
                self.coherence.before_step(step.mode == "train")
        step.calls += 1
        if self._model_forward is None or self.model is None:
            raise DeviceUsageError("wrap the model with cbtorch.module(model) before calling it")
        if self.view.after_update:  # a call after optimizer.step(): its recording reads the CPU copies
            with self.view.internal():
                out = step.recorder.model_call(self.model, self._model_forward, args, kwargs,
                                               on_backward=self._on_backward)
        else:
            out = step.recorder.model_call(self.model, self._model_forward, args, kwargs,
                                           on_backward=self._on_backward)
        with self.view.internal():
            self.coherence.after_call(step.recorder.recording_step)
        return out

    def _dispatch(self) -> None:
        """End the open step: compile its recording (the mode's first step), send its inputs (the
        host values the device takes, in the order the step handed them over)."""
        step, self.open_step = self.open_step, None
        assert step is not None  # noqa: S101 - callers check
        self._unmark()
        self.view.after_update = False
        recording, values = step.recorder.end()
        if step.calls == 0:
            return  # a batch the loop did not use: nothing to run
        trains = step.mode == "train"
        with self.view.internal():
            writes = self.coherence.at_boundary(trains)  # before a compile runs the model again
        plan = self._step_plan() if trains else FULL_STEP
        inputs = values.inputs
        if self.options.path.compiles_only:
            self._compile_and_exit(inputs, recording)
        batch: Any = inputs
        if self.cluster is not None:  # before a compile: an input the systems cannot take is refused at once
            batch = self.cluster.shards(values, step.extras or [])
        if step.recorder.recording is None:
            step.recorder.compiled(recording)
        loaded = self.loaded
        if loaded is None or loaded.mode != step.mode or loaded.step != recording.signature() or \
                (trains and self.coherence.recompile_due):
            self._compile_and_load(inputs, step.mode, recording)
        device = self._device()
        if trains:
            with self.view.internal():
                plan = self.coherence.plan(plan, device.state_dict)
        if writes is not None:  # the host's edits, before the step (after every step sent before it)
            device.load_state_dict(writes, strict=False, load_optimizer=False)
        if self.coherence.optimizer_state_edited:
            self._write_optimizer_state()
        check = None
        if self.verifier.wants(self.steps_begun):
            check = self.verifier.start(self.steps_begun, self._unchecked_because(step, plan),
                                        lambda: self._start_check(step, recording, plan, inputs))
            if check is not None and plan.update:
                plan = replace(plan, report_gradients=True)
        handle = device.submit(batch, plan)
        self.coherence.sent(trains)
        if check is not None:
            device.synchronize()
            with self.view.internal():
                self.verifier.finished(check.finish(handle.result(), device.state_dict()))
        values.inputs = ()  # the device has them: a step value kept for a later closure must not keep the batch
        values.outputs = handle.result
        if trains:
            self.view.stale = True

    def _start_check(self, step: OpenStep, recording: Recording, plan: StepPlan,
                     inputs: tuple[torch.Tensor, ...]) -> StepCheck | None:
        """A check of this step against eager PyTorch (the device's state before it fetched now)."""
        model, loaded = self.model, self.loaded
        if model is None or loaded is None:
            return None
        settings = self.options.settings or CompileSettings()
        trains = step.mode == "train"
        facts = StepFacts(number=self.steps_begun, mode=step.mode, recording=recording, inputs=inputs, plan=plan,
                          precision=loaded.spec.precision, learning_rates=self._step_rates,
                          schedule=settings.learning_rate if settings.learning_rate not in (None, 0, 0.0) else None,
                          settings_clip=(settings.max_gradient_norm, settings.max_gradient_value),
                          stepped_at=self.order.stepped_at,
                          group_values=self.coherence.groups.last if trains and self.coherence.groups else [])
        with self.view.internal():
            return StepCheck(facts, model, self.optimizer if trains else None, self._device().state_dict(), self.view)

    def _unchecked_because(self, step: OpenStep, plan: StepPlan) -> str:
        """Why this step cannot be checked against eager PyTorch ("" when it can)."""
        device = self._device()
        if self.model is None or self.loaded is None:
            return "the model is not wrapped"
        if self.cluster is not None:
            return (f"on a cluster of {self.cluster.num_csx} systems a step trains on {self.cluster.num_csx} batches, "
                    "and the check runs eager PyTorch on one")
        if self._random and not (isinstance(device, EmbeddedDevice) and device.device.type == "cpu"):
            return ("it draws random numbers from values the device computes (not dropout, which the host draws): "
                    "only the in-process CPU emulator draws those as eager does")
        if step.mode == "train" and plan.backward and not plan.clear_grads:
            return "it adds to gradients earlier steps accumulated, which are not part of the device's state"
        return ""

    def optimizer_step(self) -> None:
        """``optimizer.step()``: checked; counts the global step."""
        self.order.optimizer_step()
        if self.optimizer is not None and optimizer_hooks_on(self.optimizer):
            raise DeviceUsageError(f"{at(self.order.stepped_at)}the optimizer has step hooks "
                                   "(register_step_pre_hook / register_step_post_hook): they run Python around each "
                                   "update, which the device runs itself and would leave them out; remove them, or "
                                   "do their work in a step closure")
        if self.open_step is not None:
            self.open_step.recorder.optimizer_stepped()
            self.view.after_update = True
        if self.optimizer is not None:  # what the script's optimizer would use (the check's eager step)
            self._step_rates = [float(g["lr"]) for g in self.optimizer.param_groups]
        self.coherence.stepped(self.order.stepped_at)
        self.steps_taken += 1

    def global_step(self) -> int:
        """Training steps taken (plus a loaded state's); the device counts a skipped update's step."""
        return self.steps_taken

    def skipped_step(self) -> None:
        """Nothing: the device's loss scaling skips and counts its own steps."""

    def loss_scaled(self, unscaled: bool) -> None:
        """The loop's scaler scaled the loss, or unscaled the gradients (the device does both)."""
        self.order.loss_scaled(unscaled)

    def apply_settings(self, settings: CompileSettings) -> None:
        """Compile with ``settings`` from now on; refused (:class:`SettingsChangedError`, naming the
        changed fields) once a step is compiled with other settings."""
        old = self.options.settings
        if self.loaded is not None and old != settings:
            changed = [f.name for f in fields(CompileSettings)
                       if getattr(old, f.name, None) != getattr(settings, f.name)]
            raise SettingsChangedError(f"{', '.join(changed) or 'a compile setting'} changed after the step was "
                                       "compiled: set it before the first step and keep it for the run")
        self.options = replace(self.options, settings=settings)

    # -- compile and load ---------------------------------------------------------------------

    def settings_for(self, mode: Mode) -> CompileSettings:
        """The compile settings for ``mode``: the options' (or defaults), with the wrapped optimizer."""
        settings = self.options.settings if self.options.settings is not None else CompileSettings()
        if settings.mode in ("train", "eval") and settings.mode != mode:
            settings = replace(settings, mode=mode)
        if mode == "train" and self.schedulers is not None and not self._host_learning_rate():
            self.schedulers.refuse_beside(settings.learning_rate)
        if mode == "train" and self.optimizer is not None and self.model is not None:
            try:
                settings = settings_with_optimizer(settings, self.optimizer, self.model)
            except (TypeError, ValueError):
                pass  # the compiler reports it
        return settings

    def compile(self, batch: Any, mode: Mode, recording: Recording, *, validate: bool = False) -> CompileResult:
        """Capture and compile (or only validate) the recorded step on ``batch``; records :attr:`compile_info`."""
        if self.model is None:
            raise DeviceUsageError("wrap the model with cbtorch.module(model) before calling it")
        optimizer = self.optimizer if mode == "train" else None
        loader = self.session_loader
        console = log_console(highlight=False, soft_wrap=True)
        with self.view.internal(), self._user_objects(recording):
            if validate:
                result = validate_step(self.model, batch, settings=self.settings_for(mode), optimizer=optimizer,
                                       dataloader=loader, console=console, lr_schedulers=None)
            else:
                result = compile_only(self.model, batch, settings=self.settings_for(mode),
                                      model_dir=self.options.model_dir, compile_dir=self.options.compile_dir,
                                      optimizer=optimizer, dataloader=loader, console=console,
                                      lr_schedulers=None,
                                      step_key=recording.signature())
        self.compile_info = from_result(result, mode)
        return result

    def compile_step(self, *, validate: bool) -> bool:
        """R1.6's ``cbtorch.compile(validate_only=)`` on a compile-only run: compile (or only
        validate) the open step now and return whether it passed, instead of exiting."""
        if not self.options.path.compiles_only:
            raise DeviceUsageError("cbtorch.compile() is for a compile_only / validate_only run (pass "
                                   "--compile_only or --validate_only); a training run compiles at its first step")
        if self.open_step is None or self.open_step.calls == 0:
            raise DeviceUsageError("cbtorch.compile() needs a step to compile: call the model on a batch first")
        kind: PathKind = "validate_only" if validate else "compile_only"
        self.options = replace(self.options, path=replace(self.options.path, kind=kind))
        try:
            self._dispatch()
        except SystemExit as done:
            return done.code == 0
        raise DeviceUsageError("cbtorch.compile(): the step did not compile")  # not reached: dispatch exits

    def _compile_and_exit(self, batch: Any, recording: Recording) -> NoReturn:
        result = self.compile(batch, self.mode, recording, validate=self.options.path.kind == "validate_only")
        raise SystemExit(exit_code(result))

    def _compile_and_load(self, batch: Any, mode: Mode, recording: Recording) -> LoadedProgram:
        if self.loaded is not None and self.pending is None:
            self.pending = self._carry_over(mode)
        device = self._device()  # reach the system before the compile: a wrong --cs_ip fails in seconds
        result = self.compile(batch, mode, recording)
        result.raise_for_problems()
        program, spec, model, directory = result.program, result.spec, self.model, result.directory
        if spec is None:
            raise RuntimeError("csrun: the compile reported success without a program spec")  # a csrun bug
        if program is None:  # a cache hit by source: the saved program has no weight values
            if directory is None or model is None:
                raise RuntimeError("csrun: a cache hit without its directory or the model")  # a csrun bug
            program, _ = load_program(directory, weights=model.state_dict())
        loaded = LoadedProgram(mode=mode, spec=spec, step=recording.signature())
        self.verifier.program_loaded(loaded.step)  # a program loaded again (a flag switched back) is not checked again
        self._random = draws_random(program)
        t0 = time.perf_counter()
        device.load(program, loaded.spec)
        self.loaded = loaded
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self._load_onto_device(pending)
        self.coherence.loaded(trains=mode == "train", host_lr=self._host_learning_rate(),
                              host_current=not self.view.stale)
        if self.model is not None:
            with self.view.internal():
                self.view.attach_model(self.model)  # modules added since the last program
                self.weight_names.loaded(self.model)
        if self.compile_info is not None:
            self.compile_info = replace(self.compile_info, programming_time=time.perf_counter() - t0)
        return loaded

    def _host_learning_rate(self) -> bool:
        """Whether each update takes the script's ``lr`` (no compile setting schedules it:
        :mod:`csrun.driver.coherence.hyperparameters`)."""
        settings = self.options.settings
        return settings is None or settings.learning_rate in (None, 0, 0.0)

    def _carry_over(self, mode: Mode) -> PendingState:
        """Switching programs (train <-> eval, or another train program): the weights (and training
        state, and the gradients eager holds) to load into the next. A weight the structure change
        renamed (pruning's ``weight_orig``, a parametrization's ``original``) keeps its state, and a
        weight that left the trainable set gets its optimizer state back when it returns."""
        with self.view.internal():
            self._flush_edits()
            device_state = legacy_state.renamed(self._device().state_dict(), *self.weight_names.renames(self.model))
            current = self._get_state(device_state)
        if self.loaded is not None and self.loaded.mode == "train" and self.device is not None:
            self.weight_names.carry_optimizer_state(current, self.model, self.optimizer)
            self.train_state = current
            self._train_held = tuple(device_state.get("gradients_held") or ())
        carried = self.train_state if mode == "train" and self.train_state is not None else current
        return PendingState(state=carried, strict=False, load_optimizer=mode == "train",
                            gradients_held=self._train_held if mode == "train" else None)

    def _optimizer_slots(self) -> Mapping[int, Mapping[str, Any]] | None:
        """The device's optimizer state by the host optimizer's numbering (None: nothing loaded)."""
        with self.view.internal():
            state = self.device_state()
        if state is None or not self.loaded or self.loaded.mode != "train":
            return None
        return (state.get("optimizer") or {}).get("state") or {}

    def _write_optimizer_state(self) -> None:
        """The script changed the optimizer's state on the host: the device takes it (before the step)."""
        self.coherence.optimizer_state_edited = False
        if self.optimizer is None:
            return
        with self.view.internal():
            self.load_optimizer_state(torch.optim.Optimizer.state_dict(self.optimizer))
        if self.coherence.optimizer_state is not None:
            self.coherence.optimizer_state.synced()

    def _device(self) -> Device:
        """The device, opened on first use (and closed at interpreter exit)."""
        if self.device is None:
            self.device = open_device(self.options)
        if not self._atexit:
            atexit.register(self.close)
            self._atexit = True
        return self.device

    # -- state --------------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """The legacy state (with the host's edits since the last step); waits for every submitted step."""
        with self.view.internal():
            self._flush_edits()
            return self._get_state()

    def _flush_edits(self) -> None:
        """Write the host's edits made since the last step to the device (between steps)."""
        if self.loaded is None or self.device is None or self.open_step is not None:
            return
        writes = self.coherence.flush()
        if writes is not None:
            self.device.load_state_dict(writes, strict=False, load_optimizer=False)

    def _get_state(self, device_state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        if self.loaded is None or self.device is None:
            if self.pending is not None:
                return dict(self.pending.state)
            return legacy_state.eager_state(self.model, self.optimizer, self.steps_taken)
        own_rates = self._host_learning_rate() or (self.schedulers is not None and bool(self.schedulers.schedulers))
        state = legacy_state.from_device(device_state or self.device.state_dict(), self.model, self.optimizer,
                                         own_learning_rates=own_rates)
        if self.loaded.mode != "train":
            state["global_step"] = self.steps_taken
            if self.train_state is not None:
                state["optimizer"] = self.train_state.get("optimizer", {})
                state["amp"] = self.train_state.get("amp", {})
        return state

    def set_state(self, state: Mapping[str, Any], *, strict: bool = True, load_optimizer: bool = True) -> None:
        """Load onto the device now, or when the program is loaded; the host copies of the weights
        take the state's too (so a later edit on the host starts from them, as in eager PyTorch)."""
        with self.view.internal():
            self._set_state(state, strict=strict, load_optimizer=load_optimizer)
            if self.model is not None:
                copy_into(self.model, state["model"])
        self.view.stale = False
        self.coherence.state_loaded(host_current=True)

    def _set_state(self, state: Mapping[str, Any], *, strict: bool, load_optimizer: bool) -> None:
        state = legacy_state.check(state)
        if load_optimizer:
            self.steps_taken = legacy_state.step_of(state)
        pending = PendingState(state=state, strict=strict, load_optimizer=load_optimizer)
        if self.loaded is None:
            self.pending = pending
            return
        self._load_onto_device(pending)

    # -- the state view's source (csrun.driver.state_view.StateSource) ---------------------------

    def device_state(self) -> Mapping[str, Any] | None:
        """The legacy state on the device (waits for sent steps); None when no program is loaded."""
        if self.loaded is None or self.device is None:
            return None
        return self._get_state()

    def load_model_state(self, state: Mapping[str, Any], strict: bool) -> None:
        """``model.load_state_dict`` reached the device (weights only; kept for the program when none is loaded)."""
        full = {"model": dict(state), "optimizer": {}, "amp": {}, "global_step": self.steps_taken}
        if self.loaded is None:
            if self.pending is not None:
                self.pending = replace(self.pending, state={**self.pending.state, "model": dict(state)})
            return
        self._load_onto_device(PendingState(state=full, strict=strict, load_optimizer=False))

    def load_optimizer_state(self, state: Mapping[str, Any]) -> None:
        """``optimizer.load_state_dict`` reached the device (kept for the program when none is loaded)."""
        if self.loaded is None:
            if self.pending is not None:
                self.pending = replace(self.pending, state={**self.pending.state, "optimizer": dict(state)})
            return
        current = self._get_state()
        current["optimizer"] = dict(state)
        self._load_onto_device(PendingState(state=current, strict=False, load_optimizer=True))

    def _load_onto_device(self, pending: PendingState) -> None:
        device = self._device()
        dev = legacy_state.to_device(pending.state, device.state_dict(), self.model, self.optimizer,
                                     strict=pending.strict)
        if pending.gradients_held is not None:
            dev["gradients_held"] = list(pending.gradients_held)
        device.load_state_dict(dev, strict=False, load_optimizer=pending.load_optimizer)

    def close(self) -> None:
        """Release the closure thread and the device."""
        self.closures.close()
        device, self.device = self.device, None
        self.loaded = None
        if device is not None:
            with contextlib.suppress(Exception):
                device.close()
