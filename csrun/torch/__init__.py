"""The user API: ``import csrun.torch as cbtorch`` (the legacy ``cerebras.framework.torch``).

One script runs unchanged as a lone CPU task (``python run.py``), under ``mpiexec -n K``
and under Slurm (``srun --mpi=pmi2``): rank 0 is the chief, every other rank a streamer::

    import csrun.torch as cbtorch

    cbtorch.initialize(cs_ip=args.cs_ip)          # None: eager PyTorch on the CPU
    model = cbtorch.module(MyModel())
    opt = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    loader = cbtorch.dataloader(torch.utils.data.DataLoader(ds, batch_size=64, drop_last=True))

    @cbtorch.step_closure
    def log(loss):
        cbtorch.master_print(float(loss))

    with cbtorch.Session(loader, mode="train"):   # streamers stream here and exit 0
        for inputs, labels in loader:               # chief: batches from the streamers
            opt.zero_grad()
            loss = loss_fn(model(inputs), labels)
            loss.backward()
            opt.step()
            log(loss)                               # runs at the end of this step

Public names: :func:`initialize`, :func:`module`, :func:`optimizer`, :func:`dataloader`,
:class:`Session`, :func:`add_step_closure`, :func:`step_closure` and the helpers of
:mod:`csrun.torch.helpers`. Errors a user can fix derive from
:class:`csrun.errors.UserError`. Environment variables: those of :mod:`csrun.cluster`
(rank, size, node) and :mod:`csrun.stream.wire` (``CSRUN_STREAM_TIMEOUT``,
``CSRUN_STREAM_ERROR_GRACE``). mpi4py is loaded only when the job has more than one task.
"""

from __future__ import annotations

from typing import Any

import torch

from csrun.errors import UserError
from csrun.stream.errors import BatchError, StreamError
from csrun.stream.stats import StreamStats
from csrun.torch.backend import Backend, DeviceOptions, EagerBackend, StepClosure, register_device_backend
from csrun.torch.closures import add_step_closure, step_closure
from csrun.torch.dataloader import StreamingDataLoader, dataloader
from csrun.torch.helpers import (get_ordinal, get_streaming_rank, is_master_ordinal, is_streamer, master_print,
                                 mesh_reduce, num_streamers, num_tasks, rendezvous, task_id, use_cs)
from csrun.torch.session import Session, SessionError
from csrun.torch.sharding import DataLoaderError
from csrun.torch.state import initialize
from csrun.torch.state import state as _state


def module(model: torch.nn.Module) -> torch.nn.Module:
    """The model as the backend runs it (on the CPU: the model itself)."""
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"cbtorch.module() needs a torch.nn.Module, got {type(model).__name__}")
    return _state().backend.prepare_module(model)


def optimizer(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer as the backend runs it (on the CPU: the optimizer itself)."""
    if not isinstance(opt, torch.optim.Optimizer):
        raise UserError(f"cbtorch.optimizer() needs a torch.optim.Optimizer, got "
                                         f"{type(opt).__name__}")
    return _state().backend.prepare_optimizer(opt)


__all__ = [
    "initialize", "module", "optimizer", "dataloader", "Session", "add_step_closure", "step_closure",
    "use_cs", "is_master_ordinal", "is_streamer", "get_ordinal", "get_streaming_rank", "num_tasks",
    "num_streamers", "task_id", "master_print", "rendezvous", "mesh_reduce",
    "StreamingDataLoader", "StreamStats", "StreamError", "BatchError", "DataLoaderError", "SessionError",
    "Backend", "EagerBackend", "DeviceOptions", "StepClosure", "register_device_backend",
]
