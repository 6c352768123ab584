"""The device backend: the chief's steps run on the wafer emulator (embedded or remote).

``initialize()`` picks it by the table in :mod:`csrun.torch.paths`. What it does:

* ``cbtorch.module(model)`` keeps the user's module (names, ``state_dict()`` and
  ``parameters()`` unchanged) and routes its calls here; ``cbtorch.optimizer(opt)`` keeps
  the torch optimizer, whose ``step()``/``zero_grad()`` are then only checked for order
  (:mod:`csrun.torch.device_steps`).
* The **first** ``model(batch)`` captures and compiles the step with
  :func:`csrun.compiler.compile_only` (settings from ``initialize(settings=...)``, else
  ``CompileSettings()`` with the wrapped optimizer; the Session's DataLoader for the
  short-last-batch check; ``model_dir``/``compile_dir`` from ``initialize``; the legacy
  messages on stdout), raises the compile's problems, loads the program on the device
  (opened then: :class:`~csrun.emulator.EmbeddedDevice` or
  :class:`~csrun.emulator.RemoteDevice`) with the module's current weights, applies a state
  given to ``set_state`` before, and submits the batch. Later calls check the batch against
  the captured shapes and submit it: the user's Python forward does not run again.
* ``model(batch)`` returns :class:`~csrun.torch.device_steps.StepTensor` handles (the loss,
  or a dict like the forward's). The chief runs ahead up to ``queue_depth`` steps; closures
  resolve the handles at the step boundary (:mod:`csrun.torch.device_closures`).
* ``compile_only`` / ``validate_only``: the first ``model(batch)`` compiles (or validates),
  and raises ``SystemExit(0)`` on success, ``SystemExit(1)`` on failure; the Session then
  stops the streamers (they exit 0).
* A Session in ``eval`` mode compiles an eval program (forward only) on its first batch,
  with the weights the device holds (after training) or those given to ``set_state``.
* ``global_step()`` counts ``optimizer.step()`` calls (plus a loaded state's step);
  ``get_state()`` waits for the device and maps its state to the legacy keys
  (:mod:`csrun.torch.legacy_state`); ``set_state()`` loads onto the device, or keeps the
  state until the program is loaded.
* ``compile_info`` holds the last compile's figures (:mod:`csrun.torch.compile_info`).

The device is closed at interpreter exit (or by :meth:`DeviceBackend.close`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import time
from dataclasses import replace
from typing import Any, Iterator, Mapping

import torch

from csrun.errors import UserError
from csrun.torch import legacy_state
from csrun.torch.backend import DeviceOptions, StepClosure
from csrun.torch.compile_info import CompileInfo, from_result
from csrun.torch.device_closures import ClosureRunner
from csrun.torch.device_steps import StepOrder, StepTensor


class DeviceUsageError(UserError):
    """The model or optimizer was used in a way the device path cannot run."""


def open_device(options: DeviceOptions, job_id: str = "") -> Any:
    """The emulator this run uses: embedded in this process, or the server at ``cs_ip``."""
    if options.cs_ip:
        from csrun.emulator.auth_token import client_token
        from csrun.emulator.client import RemoteDevice

        return RemoteDevice(options.cs_ip, client_token(), job_id or os.environ.get("SLURM_JOB_ID") or str(os.getpid()),
                            queue_depth=options.queue_depth)
    from csrun.emulator.embedded import EmbeddedDevice

    return EmbeddedDevice(device=options.device, queue_depth=options.queue_depth)


class DeviceBackend:
    """Runs the chief's steps on the emulator (see the module manual)."""

    name = "device"

    def __init__(self, options: DeviceOptions, *, device: Any = None) -> None:
        """``device``: an already open :class:`~csrun.emulator.device.Device` (tests); else opened
        at the first load as ``options`` say."""
        self.options = options
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.device = device
        self.mode = "train"
        """The Session's mode (``train`` outside a Session)."""
        self.spec: Any = None
        self.loaded_mode: str | None = None
        """Mode of the program on the device (None before the first step)."""
        self.compile_info: CompileInfo | None = None
        """The last compile's figures."""
        self._out_is_leaf = True
        self._pending: tuple[Mapping[str, Any], bool, bool] | None = None
        self._train_state: Mapping[str, Any] | None = None
        self._global_step = 0
        self.order = StepOrder()
        self.closures = ClosureRunner()
        self._atexit = False

    # -- seam: module / optimizer ---------------------------------------------------------

    def prepare_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Route ``model(...)`` calls to the device; the module is returned unchanged otherwise."""
        backend = self

        def forward(*args: Any, **kwargs: Any) -> Any:
            return backend.forward(*args, **kwargs)

        model.forward = forward  # instance attribute: nn.Module.__call__ finds it first
        self.model = model
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """``step()`` and ``zero_grad()`` become order checks (the device runs the optimizer)."""
        backend = self

        def step(closure: Any = None) -> None:
            backend.optimizer_step()

        def zero_grad(set_to_none: bool = True) -> None:
            backend.order.zero_grad()

        optimizer.step = step  # type: ignore[method-assign]
        optimizer.zero_grad = zero_grad  # type: ignore[method-assign]
        self.optimizer = optimizer
        return optimizer

    @contextlib.contextmanager
    def _user_objects(self) -> Iterator[None]:
        """The user's own forward/step/zero_grad while the compiler looks at them."""
        saved = []
        for obj, names in ((self.model, ("forward",)), (self.optimizer, ("step", "zero_grad"))):
            for name in names:
                if obj is not None and name in obj.__dict__:
                    saved.append((obj, name, obj.__dict__.pop(name)))
        try:
            yield
        finally:
            for obj, name, value in saved:
                obj.__dict__[name] = value

    # -- seam: session ----------------------------------------------------------------------

    def begin_session(self, mode: str) -> None:
        """Remember the mode; a program of the other mode is replaced at the first batch."""
        self.mode = mode
        self.order.mode = mode
        self.order.phase = "idle"
        if self.model is not None:
            self.model.train(mode == "train")

    def prepare_batch(self, batch: Any) -> Any:
        """Batches stay on the CPU until ``model(batch)`` sends them."""
        return batch

    def end_step(self, closures: list[StepClosure]) -> None:
        """Run the step's closures (handles resolved); surface async closure errors."""
        self.closures.run(closures)

    def end_session(self, failed: bool) -> None:
        """Wait for async closures and the device; check the last step was complete."""
        if failed:
            with contextlib.suppress(BaseException):
                self.closures.settle()
            self.order.phase = "idle"
            return
        self.closures.settle()
        self.order.finish()
        if self.device is not None and self.loaded_mode is not None:
            self.device.synchronize()

    # -- the step ---------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """``model(batch)``: compile on the first call, then send the batch to the device."""
        if len(args) != 1 or kwargs:
            raise DeviceUsageError("on the device the model is called with one argument, the batch: "
                                   "model(batch), whose forward(batch) returns the loss (or a dict with 'loss')")
        batch = args[0]
        if self.options.compile_only or self.options.validate_only:
            self._compile_and_exit(batch)
        mode = self.mode
        if mode == "train":
            self.order.check_forward()
        if self.loaded_mode != mode:
            self._compile_and_load(batch, mode)
        else:
            from csrun.compiler import check_batch

            check_batch(batch, self.spec)
        handle = self.device.submit(batch)
        self.order.forward(handle.step)
        return self._outputs(handle)

    def _outputs(self, handle: Any) -> Any:
        names = tuple(self.spec.outputs or ("loss",))
        if self._out_is_leaf:
            return StepTensor(handle, "loss", self.order.backward)
        return {n: StepTensor(handle, n, self.order.backward) for n in names}

    def optimizer_step(self) -> None:
        """``optimizer.step()``: checked; counts the global step."""
        self.order.optimizer_step()
        self._global_step += 1

    # -- compile ----------------------------------------------------------------------------

    def _settings(self, mode: str) -> Any:
        from csrun.compiler import CompileSettings

        settings = self.options.settings if self.options.settings is not None else CompileSettings()
        if settings.mode in ("train", "eval") and settings.mode != mode:
            settings = replace(settings, mode=mode)
        if mode == "train" and self.optimizer is not None and self.model is not None:
            settings = _with_optimizer(settings, self.optimizer, self.model)
        return settings

    def _compile(self, batch: Any, mode: str, *, validate: bool = False) -> Any:
        from rich.console import Console

        from csrun.compiler import compile_only, validate_only
        from csrun.torch.state import state

        if self.model is None:
            raise DeviceUsageError("wrap the model with cbtorch.module(model) before calling it")
        session = state().session
        loader = getattr(getattr(session, "dataloader", None), "loader", None)
        optimizer = self.optimizer if mode == "train" else None
        console = Console(highlight=False, soft_wrap=True)
        with self._user_objects():
            if validate:
                result = validate_only(self.model, batch, settings=self._settings(mode), optimizer=optimizer,
                                       dataloader=loader, console=console)
            else:
                result = compile_only(self.model, batch, settings=self._settings(mode),
                                      model_dir=self.options.model_dir, compile_dir=self.options.compile_dir,
                                      optimizer=optimizer, dataloader=loader, console=console)
        self.compile_info = from_result(result, mode)
        return result

    def _compile_and_exit(self, batch: Any) -> None:
        from csrun.compiler import exit_code

        result = self._compile(batch, self.mode, validate=self.options.validate_only)
        raise SystemExit(exit_code(result))

    def _compile_and_load(self, batch: Any, mode: str) -> None:
        from csrun.compiler import load_program

        if self.loaded_mode is not None and self._pending is None:
            # switching programs (train <-> eval): carry the weights (and training state) over
            current = self.get_state()
            if self.loaded_mode == "train":
                self._train_state = current
            carried = self._train_state if mode == "train" and self._train_state is not None else current
            self._pending = (carried, False, mode == "train")
        result = self._compile(batch, mode)
        result.raise_for_problems()
        program = result.program
        if program is None:  # a cache hit by source: the saved program has no weight values
            program, _ = load_program(result.directory, weights=self.model.state_dict())
        self.spec = result.spec
        out_spec = program.call_spec.out_spec
        self._out_is_leaf = out_spec is None or out_spec.is_leaf()
        if self.device is None:
            from csrun.torch.state import state

            self.device = open_device(self.options, state().info.job_id)
        if not self._atexit:
            atexit.register(self.close)
            self._atexit = True
        t0 = time.perf_counter()
        self.device.load(program, self.spec)
        self.loaded_mode = mode
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._load_onto_device(*pending)
        if self.compile_info is not None:
            self.compile_info = replace(self.compile_info, programming_time=time.perf_counter() - t0)

    # -- state ------------------------------------------------------------------------------

    def global_step(self) -> int:
        """Optimizer steps taken (plus a loaded state's)."""
        return self._global_step

    def get_state(self) -> dict[str, Any]:
        """The legacy state; waits for every submitted step."""
        if self.loaded_mode is None:
            if self._pending is not None:
                return dict(self._pending[0])
            return legacy_state.eager_state(self.model, self.optimizer, self._global_step)
        dev = self.device.state_dict()
        state = legacy_state.from_device(dev, self.model, self.optimizer)
        if self.loaded_mode != "train":
            state["global_step"] = self._global_step
            if self._train_state is not None:
                state["optimizer"] = self._train_state.get("optimizer", {})
                state["amp"] = self._train_state.get("amp", {})
        return state

    def set_state(self, state: Mapping[str, Any], *, strict: bool = True, load_optimizer: bool = True) -> None:
        """Load onto the device now, or when the program is loaded."""
        state = legacy_state.check(state)
        if load_optimizer:
            self._global_step = legacy_state.step_of(state)
        if self.loaded_mode is None:
            self._pending = (state, strict, load_optimizer)
            return
        self._load_onto_device(state, strict, load_optimizer)

    def _load_onto_device(self, state: Mapping[str, Any], strict: bool, load_optimizer: bool) -> None:
        template = self.device.state_dict()
        dev = legacy_state.to_device(state, template, self.model, self.optimizer, strict=strict)
        self.device.load_state_dict(dev, strict=False, load_optimizer=load_optimizer)

    def close(self) -> None:
        """Release the closure thread and the device."""
        self.closures.close()
        device, self.device = self.device, None
        self.loaded_mode = None
        if device is not None:
            with contextlib.suppress(Exception):
                device.close()


def _with_optimizer(settings: Any, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> Any:
    """Fill the optimizer spec from the torch optimizer, as the compiler would."""
    from csrun.compiler.flow import settings_with_optimizer

    try:
        return settings_with_optimizer(settings, optimizer, model)
    except (TypeError, ValueError):
        return settings  # the compiler reports it


def make_device_backend(options: DeviceOptions) -> DeviceBackend:
    """The factory :func:`csrun.torch.backend.register_device_backend` installs."""
    return DeviceBackend(options)
