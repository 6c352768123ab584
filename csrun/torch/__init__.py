"""The user API: ``import csrun.torch as cbtorch`` (the legacy ``cerebras.framework.torch``).

One script runs unchanged as a lone CPU task (``python run.py``), under ``mpiexec -n K``
and under Slurm (``srun --mpi=pmi2``): rank 0 is the chief, every other rank a streamer::

    import csrun.torch as cbtorch

    cbtorch.initialize(cs_ip=args.cs_ip)          # the path: see the table below
    model = cbtorch.module(MyModel())             # any forward: logits, a dict, a ModelOutput
    opt = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100)   # optional; runs on the device
    loader = cbtorch.dataloader(torch.utils.data.DataLoader(ds, batch_size=64, drop_last=True))
    loss_fn = torch.nn.CrossEntropyLoss()

    @cbtorch.step_closure
    def log(loss):
        cbtorch.master_print(cbtorch.global_step(), float(loss))

    with cbtorch.Session(loader, mode="train"):   # streamers stream here and exit 0
        for inputs, targets in loader:              # chief: batches from the streamers
            opt.zero_grad()
            loss = loss_fn(model(inputs), targets)  # or model(batch) returning the loss
            loss.backward()
            opt.step()
            sched.step()
            log(loss)                               # runs at the end of this step
    state = cbtorch.get_state()                     # {"model", "optimizer", "amp", "global_step"}

Which path the chief takes (``initialize(cs_ip=None, *, compile_only=False,
validate_only=False, settings=None, model_dir=None, compile_dir=None, device="cpu",
queue_depth=2)``; the one decision is :func:`csrun.driver.run_path.decide`, addresses are
parsed by :func:`csrun.address.parse_address`):

=============================================================  ==================================
``compile_only=True`` / ``validate_only=True``                 compile/validate at the end of
                                                               the first step, print the legacy
                                                               messages, stop the streamers,
                                                               ``SystemExit(0 or 1)``
``cs_ip="embedded"``                                           EmbeddedDevice in this process
``cs_ip=None``, ``CS_IP`` unset, ``CSRUN_LAUNCHER=csrun_wse``  EmbeddedDevice in this process
``cs_ip="HOST[:PORT]"`` or ``CS_IP=HOST[:PORT]``               RemoteDevice (cs_emulator server;
                                                               port 9000 when none, ``[v6]:port``)
otherwise (``csrun_cpu``, plain ``python``)                    eager PyTorch on the CPU
=============================================================  ==================================

On the device the **whole step** is captured, as the system traced it: everything the step
computes from the batch up to its boundary (the next batch) — any number of model calls with
any positional or keyword arguments, a loss computed outside the model, metrics after
``optimizer.step()`` — is recorded in the Session's first step and compiled as one program;
later steps are checked against it at a small cost per operation (BENCHMARKS.md), and a step that
differs (another branch, another loss, another shape) is refused naming its file and line
(the design: :mod:`csrun.driver.step_recording`; the driver, which is the device backend:
:mod:`csrun.driver.driver`). The batch's own values stay readable on
the chief; the model's outputs and what is computed from them are device values, read in
step closures (anywhere else they raise the system's hint). ``loss.backward()``,
``optimizer.step()``, ``optimizer.zero_grad()`` and ``lr_scheduler.step()`` are checked for
order and otherwise do nothing there: the device runs backward, the optimizer, the
learning-rate schedule (torch's StepLR, MultiStepLR, ExponentialLR, LinearLR, ConstantLR,
CosineAnnealingLR, PolynomialLR, SequentialLR and ChainedScheduler become the device's,
:mod:`csrun.driver.schedulers`; others are refused when built), clipping and loss scaling
itself. The wrapped model's parameters and ``state_dict()`` and the optimizer's
``state_dict()`` show the device's values whenever they are read, and ``load_state_dict``
reaches the device (:mod:`csrun.driver.state_view`). On the CPU with ``settings`` the same
schedule and clipping apply to the torch optimizer.

State and step (both paths): :func:`global_step` (optimizer steps taken),
:func:`get_state` (``{"model", "optimizer", "amp", "global_step"}``, the legacy checkpoint
keys, see :mod:`csrun.driver.legacy_state`), :func:`set_state` (before or between steps),
:func:`compile_info` (compile seconds and the estimated samples/s, for performance.json).

The legacy surface: ``import csrun.torch.core.cb_model as cm`` (``add_step_closure(fn,
args=(), kwargs={}, run_async=False)``, ``step_closure``, ``mark_step``, ``get_ordinal``,
``get_local_ordinal``, ``is_master_ordinal(local=False)``, ``xrt_world_size``: see
:mod:`csrun.torch.core.cb_model`); ``module(model, device=None)``; ``Session.add_step_closure``
and ``Session.mark_step``; :func:`save` / :func:`load` (the ``.mdl`` file as weights-only data:
:mod:`csrun.torch.saving`). Scripts that keep the R1.x imports (``import
cerebras.framework.torch as cbtorch``) run unedited under ``csrun_wse --legacy-imports`` /
``csrun_cpu --legacy-imports``, which put a shim folder (``csrun/torch/legacy_shim``) first on
the job's ``PYTHONPATH``; nothing named ``cerebras`` is installed. ``cbtorch.amp.GradScaler``
(:mod:`csrun.torch.amp`): ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()``
scales on the CPU and leaves the scaling to the device on the device. :func:`state` is the
R1.x runtime-state object (:mod:`csrun.torch.stack_state`): compiler knobs a model sets on
``state().full_config`` are recorded and ignored with one notice each,
``is_inside_execution_loop``, ``register_metric``, ``track_object``, ``init_tracker``.

Public names: :func:`initialize`, :func:`module`, :func:`optimizer`, :func:`dataloader`,
:class:`Session`, :func:`add_step_closure`, :func:`step_closure`, :func:`global_step`,
:func:`get_state`, :func:`set_state`, :func:`compile_info`, :func:`save`, :func:`load`, :func:`state` and
the helpers of :mod:`csrun.torch.helpers`. Errors a user can fix derive from
:class:`csrun.errors.UserError`. Environment variables: those of :mod:`csrun.cluster`
(rank, size, node, ``CSRUN_LAUNCHER``, ``SLURM_JOB_ID``) and :mod:`csrun.stream.wire`
(``CSRUN_STREAM_TIMEOUT``, ``CSRUN_STREAM_ERROR_GRACE``); ``CSRUN_GC_FREEZE`` (``0`` leaves the
garbage collector alone; by default the heap built before the work is frozen at ``initialize``
and at a Session's entry and given back at its exit: :mod:`csrun.torch.gc_policy`); ``CS_IP`` (the device address when
``cs_ip`` is not given) and ``CSRUN_EMULATOR_TOKEN`` (or ``~/.csrun/emulator.token``: the
token a remote device wants). mpi4py is loaded only when the job has more than one task.
"""

from __future__ import annotations

from typing import Any

import torch

from csrun.driver.closures import StepClosure
from csrun.driver.compile_info import CompileInfo
from csrun.driver.driver import DeviceDriver
from csrun.driver.options import DeviceOptions
from csrun.errors import UserError
from csrun.stream.errors import BatchError, StreamError
from csrun.stream.stats import StreamStats
from csrun.torch.backend import Backend, EagerBackend, register_device_backend
from csrun.torch.closures import add_step_closure, step_closure
from csrun.torch.dataloader import StreamingDataLoader, dataloader
from csrun.torch.helpers import (
    get_local_ordinal,
    get_ordinal,
    get_streaming_rank,
    is_master_ordinal,
    is_streamer,
    master_print,
    mesh_reduce,
    num_streamers,
    num_tasks,
    rendezvous,
    task_id,
    use_cs,
    world_size,
)
from csrun.torch import amp  # noqa: E402  (cbtorch.amp.GradScaler)
from csrun.torch.saving import CheckpointFileError, load, save
from csrun.torch.session import Session, SessionError
from csrun.torch.sharding import DataLoaderError
from csrun.torch.process_state import initialize
from csrun.torch.process_state import state as _state
from csrun.torch.stack_state import state
from csrun.torch.user_errors import install as _install_user_error_hook
from csrun.task_exits import install_last_word as _install_last_word
from csrun.cluster import cluster_info as _cluster_info

_install_user_error_hook()  # a UserError ending a script is one line (csrun.torch.user_errors)
_task = _cluster_info()
_install_last_word(_task.rank, _task.node_name)  # a failing task says so before MPI_Abort (csrun.task_exits)


def module(model: torch.nn.Module, device: Any = None) -> torch.nn.Module:
    """The model as the backend runs it (on the CPU: the model itself). ``device`` is accepted for
    legacy scripts (``cbtorch.module(model, device)``) and must be None or the CPU: the device's
    placement is csrun's."""
    if device is not None and torch.device(device).type != "cpu":
        raise UserError(f"cbtorch.module(model, device={device!r}): the model stays on the CPU; the device "
                        f"(cs_ip, or the embedded emulator) gets its weights when the step is compiled")
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"cbtorch.module() needs a torch.nn.Module, got {type(model).__name__}")
    return _state().backend.prepare_module(model)


def optimizer(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer as the backend runs it (on the CPU: the optimizer itself)."""
    if not isinstance(opt, torch.optim.Optimizer):
        raise UserError(f"cbtorch.optimizer() needs a torch.optim.Optimizer, got "
                                         f"{type(opt).__name__}")
    return _state().backend.prepare_optimizer(opt)


def global_step() -> int:
    """Optimizer steps taken so far (with the step a loaded state carried), on either path."""
    return _state().backend.global_step()


def get_state() -> dict[str, Any]:
    """The legacy checkpoint state ``{"model", "optimizer", "amp", "global_step"}``.

    On the device this waits for every submitted step and fetches the device's state.
    """
    return _state().backend.get_state()


def set_state(state: dict[str, Any], *, strict: bool = True, load_optimizer: bool = True) -> None:
    """Load a state from :func:`get_state` (or a legacy checkpoint), before or between steps.

    ``strict``: every model key must match. ``load_optimizer=False`` loads the weights only
    (optimizer state, loss scaler and global step stay as they are: a pretrained start).
    """
    _state().backend.set_state(state, strict=strict, load_optimizer=load_optimizer)


def compile_info() -> CompileInfo | None:
    """The last compile's figures on the device path (None on the CPU or before the first step)."""
    return getattr(_state().backend, "compile_info", None)


__all__ = [
    "initialize", "module", "optimizer", "dataloader", "Session", "add_step_closure", "step_closure",
    "save", "load", "CheckpointFileError", "get_local_ordinal", "world_size", "amp",
    "use_cs", "is_master_ordinal", "is_streamer", "get_ordinal", "get_streaming_rank", "num_tasks",
    "num_streamers", "task_id", "master_print", "rendezvous", "mesh_reduce",
    "StreamingDataLoader", "StreamStats", "StreamError", "BatchError", "DataLoaderError", "SessionError",
    "Backend", "EagerBackend", "DeviceOptions", "StepClosure", "register_device_backend",
    "global_step", "get_state", "set_state", "compile_info", "CompileInfo", "state",
]


register_device_backend(DeviceDriver)  # the device path: the driver is the device backend
