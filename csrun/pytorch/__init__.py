"""The 2.x user API: ``import csrun.pytorch as cstorch`` (the system's ``cerebras.pytorch``).

A script written for the 2.x API runs with only its import line changed, on the same device
and driver as cbtorch scripts (:mod:`csrun.torch`): as one task (``python train.py``,
``csrun_cpu``) or under ``csrun_wse`` (rank 0 the chief, every other task a streamer)::

    import torch
    import csrun.pytorch as cstorch

    backend = cstorch.backend("CSX", artifact_dir="artifacts")   # or "CPU"; cs_ip=, compile_only=
    with backend.device:
        model = MyModel()
    compiled_model = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.01)   # or optim.configure_optimizer(...)
    loss_fn = torch.nn.CrossEntropyLoss()

    @cstorch.trace                                   # or @cstorch.compile_step
    def training_step(inputs, targets):
        optimizer.zero_grad()
        loss = loss_fn(compiled_model(inputs), targets)
        loss.backward()                              # or cstorch.amp.optimizer_step(loss, optimizer, scaler)
        optimizer.step()
        return loss

    @cstorch.step_closure
    def log(loss):
        print(loss.item())

    @cstorch.checkpoint_closure
    def save(step):
        cstorch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                      "global_step": step}, f"checkpoint_{step}.mdl")

    executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(input_fn, batch_size),
                                               num_steps=100, checkpoint_steps=50)
    for inputs, targets in executor:
        log(training_step(inputs, targets))
        save(executor.step)

What each name is (each module's manual has the details):

=====================================  =======================================================
:func:`backend` / :class:`Backend`     ``"CSX"``: the wafer emulator (embedded; the
                                       ``cs_emulator`` at ``cs_ip`` / ``CS_IP``;
                                       ``compile_only`` / ``validate_only`` exit after the
                                       first step's compile; under ``csrun_cpu`` the eager
                                       validation run); ``"CPU"``: eager PyTorch.
                                       ``backend.device`` is a context manager for building
                                       the model (:mod:`csrun.pytorch.backends`)
:func:`compile`                        the model as the backend runs it (``cbtorch.module``)
:func:`trace` / :func:`compile_step`   the step, captured whole on the device by the driver
                                       (:mod:`csrun.pytorch.step`)
:func:`step_closure`                   cbtorch's: runs when the step's values are ready
:func:`checkpoint_closure`             a step closure on the executor's checkpoint steps only
:func:`save` / :func:`load`            the ``.mdl`` file, weights-only; interchangeable with
                                       cbtorch's and the runner's (:mod:`csrun.pytorch.saving`)
:mod:`optim`                           one class per optimizer type the device has,
                                       ``configure_optimizer``, ``configure_lr_scheduler``,
                                       ``optim.lr_scheduler.*`` (schedules of the global step)
:mod:`amp`                             ``GradScaler``, ``optimizer_step``, ``set_half_dtype``
:mod:`utils`                           ``utils.data.DataLoader`` / ``DataExecutor``,
                                       ``utils.CSConfig``
:func:`current_backend`                the backend this process made (None before)
:func:`current_executor`               the executor whose loop runs (None outside one)
=====================================  =======================================================

Numerics: the device computes in float32 unless ``amp.set_half_dtype`` asks for 16-bit
compute, so a float32 run on the emulator gives the eager CPU run's losses. Not provided:
``cstorch.sparse``, ``cstorch.nn`` layers, the summary writer, several systems
(``CSConfig(num_csx>1)``), ``ChainedScheduler``. Errors a user can fix derive from
:class:`csrun.errors.UserError` and say the fix in one line: :class:`BackendError`,
:class:`SettingsChangedError`, :class:`~csrun.pytorch.utils.data.ExecutorError`,
:class:`~csrun.pytorch.utils.CSConfigError`, :class:`~csrun.pytorch.amp.AmpError`,
:class:`~csrun.pytorch.optim.OptimizerError`,
:class:`~csrun.pytorch.optim.lr_scheduler.LRSchedulerError`. Environment variables: those
of :mod:`csrun.torch` (``CS_IP``, ``CSRUN_EMULATOR_TOKEN``, the launcher's).
"""

from __future__ import annotations

from csrun.pytorch import amp, optim, utils
from csrun.pytorch.backends import (
    Backend,
    BackendError,
    SettingsChangedError,
    backend,
    compile,
    current_backend,
)
from csrun.pytorch.saving import load, save
from csrun.pytorch.step import checkpoint_closure, compile_step, step_closure, trace
from csrun.pytorch.utils.data import current_executor

__all__ = [
    "backend", "Backend", "compile", "trace", "compile_step", "step_closure", "checkpoint_closure", "save",
    "load", "optim", "amp", "utils", "current_backend", "current_executor", "BackendError",
    "SettingsChangedError",
]
