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
``master_print``, ``rendezvous(tag)``, ``mesh_reduce(tag, data, reduce_fn)``
    As in :mod:`csrun.torch`.
"""

from __future__ import annotations

from csrun.torch.closures import add_step_closure, end_step, step_closure
from csrun.torch.helpers import (
    get_local_ordinal,
    get_ordinal,
    is_master_ordinal,
    master_print,
    mesh_reduce,
    rendezvous,
    world_size,
)


def mark_step() -> None:
    """End the current step now: send it to the device and run its closures."""
    end_step()


def xrt_world_size() -> int:
    """How many tasks the job has (the chief and the streamers)."""
    return world_size()


__all__ = [
    "add_step_closure", "step_closure", "mark_step", "get_ordinal", "get_local_ordinal", "is_master_ordinal",
    "xrt_world_size", "master_print", "rendezvous", "mesh_reduce",
]
