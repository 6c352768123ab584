"""A model's size, checked from its config's shapes before anything is built.

A model config (:class:`~csrun.run.params.ModelConfig`) that knows its architecture says how
many parameters it makes (:meth:`~csrun.run.params.ModelConfig.parameter_count`: arithmetic on
its keys, in Python's exact integers, so no size overflows). :func:`check_model_size` refuses a
model whose float32 weights cannot exist where it is about to be built, in one line naming the
count and the room, before a single tensor is allocated:

* built for real (a CPU run, a device run, a compile that traces a real forward): this
  machine's memory (:func:`host_memory_bytes`: physical memory, or the process's address-space
  limit when lower);
* built on torch's meta device (``--compile_only`` / ``--validate_only`` of a model with
  shapes only, :mod:`csrun.run.shapes_only`): MemoryX's capacity, the most any system holds.

The runner's params loader calls it (:func:`csrun.run.cli_args.load_params`), so
``model.depth: 1e100`` or ``hidden_size: 10**9`` ends at the params, not in an allocation that
grows for minutes. The layer counts themselves are bounded by their fields (``max=MAX_LAYERS``),
since a deep stack of small layers builds slowly without many parameters.
"""

from __future__ import annotations

import os
import resource
from typing import Any

from csrun.compiler.report import human_bytes
from csrun.compiler.wafer import MEMORYX
from csrun.errors import ConfigError

__all__ = ["BYTES_PER_PARAMETER", "MAX_LAYERS", "check_model_size", "host_memory_bytes", "linear_parameters",
           "transformer_layer_parameters"]

BYTES_PER_PARAMETER = 4
"""Bytes of one float32 weight (the master copy every path keeps)."""
MAX_LAYERS = 1024
"""The most layers (or blocks) a model config may declare: legacy models have at most a few hundred,
and a million small layers take minutes and gigabytes of Python objects to build."""


def linear_parameters(inputs: int, outputs: int, *, bias: bool = True) -> int:
    """Parameters of ``nn.Linear(inputs, outputs)``."""
    return inputs * outputs + (outputs if bias else 0)


def transformer_layer_parameters(hidden: int, filter_size: int) -> int:
    """Parameters of one transformer layer: fused QKV and output projections, a two-layer
    feed-forward network and two LayerNorms (the GPT-2 and BERT layers of models/)."""
    attention = linear_parameters(hidden, 3 * hidden) + linear_parameters(hidden, hidden)
    ffn = linear_parameters(hidden, filter_size) + linear_parameters(filter_size, hidden)
    return attention + ffn + 2 * 2 * hidden


def host_memory_bytes() -> int:
    """This machine's physical memory, or the process's address-space limit when that is lower."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return min(total, soft) if soft != resource.RLIM_INFINITY else total


def check_model_size(model: Any, *, meta: bool = False) -> None:
    """Refuse ``model`` (a model config) whose weights cannot be built: on this machine, or with
    ``meta`` (shapes only) in MemoryX. Nothing for a config that does not know its size."""
    count = getattr(model, "parameter_count", lambda: None)()
    if count is None:
        return
    need = count * BYTES_PER_PARAMETER
    room, where = ((int(MEMORYX.capacity_bytes), f"{MEMORYX.name}'s capacity") if meta
                   else (host_memory_bytes(), "this machine's memory"))
    if need > room:
        raise ConfigError(f"model: its shapes make {count:,} parameters ({human_bytes(need)} of float32 weights), "
                          f"more than {where} ({human_bytes(room)}): make it smaller (its sizes, layers, vocabulary)")
