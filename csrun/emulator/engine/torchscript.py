"""How the engine runs its TorchScript: in the executor's plain interpreter, without its optimization passes.

The engine runs two TorchScript functions every step: the forward's trace
(:mod:`csrun.emulator.engine.traced_forward`) and, for one-group SGD, the update
(:func:`csrun.emulator.engine.lean_step.sgd_update`). TorchScript's default (profiling) executor runs a
function's first call as a profiling run and its second through its optimization passes (guards,
specialisation, symbolic autodiff, and on a GPU fusion). That costs every job once, in the
update's second call (a visible part of fc_mnist's fixed cost: BENCHMARKS.md), paid inside the timed run, for no
gain on a CPU, where no fuser is on. Worse, an optimized forward would no longer run the ops that
:meth:`~csrun.emulator.engine.traced_forward.TracedForward.build` checked bit for bit against the graph
(a fused or autodiff'd graph may round differently). So both run inside :func:`unoptimized`: the
same aten ops, in order, as written, from the first call on.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def unoptimized() -> Iterator[None]:
    """TorchScript's executor without its optimization passes while inside (a thread-local switch,
    restored on the way out)."""
    before = torch._C._get_graph_executor_optimize()
    torch._C._set_graph_executor_optimize(False)
    try:
        yield
    finally:
        torch._C._set_graph_executor_optimize(before)
