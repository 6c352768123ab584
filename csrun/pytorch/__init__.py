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
:mod:`metrics`                         eval metrics updated from the traced step
                                       (:mod:`csrun.pytorch.metrics`)
:mod:`distributed`                     who this task is, for input code (the streamers are
                                       the input workers: :mod:`csrun.pytorch.distributed`)
:func:`summarize_scalar` / ``_tensor`` a step's value to the executor's ``writer``
:func:`name_scope`, :func:`pol`,       compiler annotations: accepted, they change nothing
:func:`make_constant`, debug names     (:mod:`csrun.pytorch.annotations`)
:func:`use_cs`                         True when the steps run on the device
:mod:`core`, :mod:`profiler`,          ``core.modes``; the op profiler (empty); sparsity, the
:mod:`sparse`, :mod:`saver`,           HDF5 saver, listeners: they import, and using one
:mod:`experimental`, :mod:`nn`         raises one line; ``nn.functional.one_hot``
:data:`__version__`                    the 2.x API release this follows (``2.2.1``)
=====================================  =======================================================

Numerics: the device computes in float32 unless the backend's ``mixed_precision`` is on
(``amp.set_half_dtype`` only chooses the 16-bit type), so a float32 run on the emulator gives
the eager CPU run's losses. Not provided: sparsity, ``cstorch.nn`` layers, several systems
(``CSConfig(num_csx>1)``), ``ChainedScheduler``. Errors a user can fix derive from
:class:`csrun.errors.UserError` and say the fix in one line: :class:`BackendError`,
:class:`SettingsChangedError`, :class:`~csrun.pytorch.utils.data.ExecutorError`,
:class:`~csrun.pytorch.utils.CSConfigError`, :class:`~csrun.pytorch.amp.AmpError`,
:class:`~csrun.pytorch.optim.OptimizerError`,
:class:`~csrun.pytorch.optim.lr_scheduler.LRSchedulerError`. Environment variables: those
of :mod:`csrun.torch` (``CS_IP``, ``CSRUN_EMULATOR_TOKEN``, the launcher's).
"""

from __future__ import annotations

from csrun.pytorch import (
    amp,
    core,
    distributed,
    experimental,
    metrics,
    nn,
    optim,
    profiler,
    saver,
    sparse,
    utils,
)
from csrun.pytorch.annotations import (
    add_debug_name,
    from_numpy,
    get_debug_name,
    make_constant,
    name_scope,
    pol,
    to_numpy,
    use_cs,
)
from csrun.pytorch.backends import (
    Backend,
    BackendError,
    SettingsChangedError,
    backend,
    compile,
    current_backend,
)
from csrun.module_alias import becoming
from csrun.pytorch.input_worker import on_import
from csrun.pytorch.saving import load, save
from csrun.pytorch.step import checkpoint_closure, compile_step, step_closure, trace
from csrun.pytorch.summaries import summarize_scalar, summarize_tensor
from csrun.pytorch.utils.data import current_executor

__version__ = "2.2.1"
"""The ``cerebras.pytorch`` release whose API this follows."""


def __after_alias__() -> None:
    """Run once ``cerebras.pytorch`` is this package (:mod:`csrun.module_alias`): a streamer waits for its role."""
    on_import()


if not becoming():
    on_import()  # csrun.pytorch.input_worker: a 2.x job's streamer waits here for the chief

__all__ = [
    "backend", "Backend", "compile", "trace", "compile_step", "step_closure", "checkpoint_closure", "save",
    "load", "optim", "amp", "utils", "current_backend", "current_executor", "BackendError",
    "SettingsChangedError", "core", "distributed", "experimental", "metrics", "nn", "profiler", "saver", "sparse",
    "add_debug_name", "from_numpy", "get_debug_name", "make_constant", "name_scope", "pol", "to_numpy", "use_cs",
    "summarize_scalar", "summarize_tensor", "__version__",
]
