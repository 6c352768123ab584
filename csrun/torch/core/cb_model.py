"""``cb_model``: the legacy step and ordinal helpers, as R1.x scripts import them.

A legacy script's second import, ``import cerebras.framework.torch.core.cb_model as cm``,
becomes ``import csrun.torch.core.cb_model as cm`` (or stays as written under
``csrun_wse --legacy-imports`` / ``csrun_cpu --legacy-imports``). What it offers:

``add_step_closure(fn, args=(), kwargs={}, run_async=False)``
    Run ``fn(*args, **kwargs)`` at the step's end, when the device has produced the values in
    ``args``; ``run_async`` lets the device run it on a helper thread, still in order.
``step_closure``
    Decorator: a call queues the function as a step closure with the call's arguments.
``mark_step()``
    End the current step now: it goes to the device and its closures run (otherwise the next
    batch ends it). Calling it after ``optimizer.step()`` changes nothing in a typical loop.
``get_ordinal()``, ``get_local_ordinal()``, ``is_master_ordinal(local=False)``, ``xrt_world_size()``
    This task's global rank (0: the chief), its rank on its node, whether it is the chief (with
    ``local=True``: the first task of its node), and how many tasks the job has.
``master_print``, ``mesh_reduce(tag, data, reduce_fn)``
    As in :mod:`csrun.torch`.
``rendezvous(tag, payload=None)``
    Wait for every task; returns the tasks' payloads in rank order (``[]`` without one).

The rest of R1.6's ``cm``, with R1.6's meanings (the Model Zoo's runners call them):
``use_cs()``, ``is_wse_device()`` (the run targets the device), ``is_streamer()``,
``num_streamers()``, ``get_streaming_rank()`` (0 on a chief), ``num_tasks()`` (**every** task,
as R1.6 counted; csrun's own :func:`csrun.torch.num_tasks` counts shards), ``num_receivers()``
(1), ``is_sync_mode()`` (False), ``device()`` (where the script's tensors live: the CPU),
``to_cpu(x)``, ``get_run_step()`` (optimizer steps of this run), ``set_run_config(total,
checkpoint, fetch)`` (recorded), ``set_target_num_replicas(n)`` (one replica), ``write_to_summary
(writer, global_step, dict_to_write=)``, ``print_update(device, step, loss, mode,
summary_writer=)``, ``save(obj, path, master_only=True, post_transfer_callback=None)``,
``metrics_counter_value(name)`` (the compile's figures), ``run_step_closures()`` (as
``mark_step``). ``print_metrics_report``, ``set_metric_state_names`` and ``RateTracker`` import
and refuse (:mod:`csrun.torch.r1.unsupported`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from csrun.torch import compile_info
from csrun.torch.closures import add_step_closure, end_step, step_closure
from csrun.torch.helpers import (
    get_local_ordinal,
    get_ordinal,
    is_master_ordinal,
    is_streamer,
    master_print,
    mesh_reduce,
    num_streamers,
    use_cs,
    world_size,
)
from csrun.torch.helpers import get_streaming_rank as _streaming_rank
from csrun.torch.helpers import rendezvous as _barrier
from csrun.torch.process_state import state
from csrun.torch.r1.unsupported import refuse, unsupported, unsupported_class
from csrun.torch.saving import save as _save


@dataclass
class RunConfig:
    """What ``set_run_config`` was told (R1.6 sized the device's run by it; csrun streams until the loop ends)."""

    total_steps: int = 0
    checkpoint_steps: int = 0
    fetch_steps: int = 0


run_config = RunConfig()
"""The last :func:`set_run_config`."""
_last_update: list[float] = []


def mark_step() -> None:
    """End the current step now: send it to the device and run its closures."""
    end_step()


def run_step_closures() -> None:
    """Run the queued closures now (as :func:`mark_step`)."""
    end_step()


def xrt_world_size() -> int:
    """How many tasks the job has (the chief and the streamers)."""
    return world_size()


def num_tasks() -> int:
    """Every task of the job, the chief included (R1.6's meaning)."""
    return world_size()


def is_wse_device() -> bool:
    """True when the run targets the device."""
    return use_cs()


def get_streaming_rank() -> int:
    """This streamer's rank among the streamers (0 on a chief)."""
    return max(_streaming_rank(), 0)


def num_receivers() -> int:
    """Tasks that receive the device's outputs: the one chief."""
    return 1


def is_sync_mode() -> bool:
    """False: the chief runs ahead of the device by the queue depth."""
    return False


def device() -> torch.device:
    """Where the script's tensors live (the device holds its own copies): the CPU."""
    return torch.device("cpu")


def to_cpu(value: Any) -> Any:
    """``value`` (a tensor, or tensors in lists, tuples and dicts) as CPU tensors."""
    return pytree.tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, value)


def get_run_step() -> int:
    """Optimizer steps this run has taken."""
    return state().backend.global_step()


def set_run_config(total_steps: int, checkpoint_steps: int, fetch_steps: int) -> None:
    """Record the run's size (:data:`run_config`)."""
    run_config.total_steps, run_config.checkpoint_steps, run_config.fetch_steps = \
        int(total_steps), int(checkpoint_steps), int(fetch_steps)


def set_target_num_replicas(num_replicas: int) -> None:
    """One replica (``1``, or ``-1``: as many as fit, which is one here); more are refused."""
    if num_replicas not in (1, -1):
        refuse(f"cm.set_target_num_replicas({num_replicas!r})", "the emulator runs one replica of the model "
               "(set runconfig.num_replicas: 1)")


def write_to_summary(summary_writer: Any, global_step: int, dict_to_write: dict[str, Any] | None = None) -> None:
    """Add each ``dict_to_write`` value as a scalar at ``global_step`` (nothing when the writer is None)."""
    if summary_writer is None:
        return
    for name, value in (dict_to_write or {}).items():
        summary_writer.add_scalar(name, float(value), global_step)


def print_update(device: Any, step: int, loss: float, mode: str, summary_writer: Any = None) -> None:
    """Print ``| Train Device=... Step=... Loss=... Rate=...`` (steps per second since the last update)."""
    now = time.perf_counter()
    last = _last_update[-1] if _last_update else None
    _last_update[:] = [now]
    rate = "" if last is None or now <= last else f" Rate={1.0 / (now - last):.2f} steps/s"
    print(f"| {str(mode).capitalize()} Device={device} Step={step} Loss={float(loss):.5f}{rate}", flush=True)
    if summary_writer is not None and rate:
        summary_writer.add_scalar("steps_per_sec", 1.0 / (now - last), step)  # type: ignore[operator]


def save(obj: Any, path: str | os.PathLike[str], master_only: bool = True,
         post_transfer_callback: Callable[[Any], Any] | None = None) -> None:
    """Write ``obj`` (moved to the CPU, then through ``post_transfer_callback``) as a ``.mdl``; with
    ``master_only`` only the chief writes."""
    if master_only and not is_master_ordinal():
        return
    obj = to_cpu(obj)
    if post_transfer_callback is not None:
        obj = post_transfer_callback(obj)
    _save(obj, path)


def rendezvous(tag: str, payload: Any = None) -> list[Any]:
    """Wait for every task at ``tag``; with a ``payload``, every task's, in rank order."""
    if payload is None:
        _barrier(tag)
        return []
    return mesh_reduce(tag, payload, list)


def metrics_counter_value(name: str) -> int | None:
    """The compile's figures by the system's counter names (None for any other, or before a compile)."""
    compiled = compile_info()
    if compiled is None:
        return None
    values = {"CerebrasCompileTimeMs": compiled.compile_time * 1e3,
              "CerebrasProgrammingTimeNs": compiled.programming_time * 1e9,
              "CerebrasSystemEstSamples": compiled.est_samples_per_sec}
    value = values.get(name)
    return None if value is None else int(value)


_DEBUG = "the system's debug metrics report has no counterpart (leave runconfig.show_debug_metrics off)"
print_metrics_report = unsupported("cm.print_metrics_report", _DEBUG)
set_metric_state_names = unsupported("cm.set_metric_state_names", "weight streaming's metrics are not R1.6 pipelined mode")
RateTracker = unsupported_class("cm.RateTracker", "csrun reports throughput in the Session's report and "
                                "performance.json")


__all__ = [
    "add_step_closure", "step_closure", "mark_step", "run_step_closures", "get_ordinal", "get_local_ordinal",
    "is_master_ordinal", "xrt_world_size", "master_print", "rendezvous", "mesh_reduce", "use_cs", "is_wse_device",
    "is_streamer", "num_streamers", "get_streaming_rank", "num_tasks", "num_receivers", "is_sync_mode", "device",
    "to_cpu", "get_run_step", "set_run_config", "set_target_num_replicas", "write_to_summary", "print_update",
    "save", "metrics_counter_value", "print_metrics_report", "set_metric_state_names", "RateTracker",
]
