"""``cstorch.summarize_scalar`` / ``summarize_tensor``: values of the traced step, written to TensorBoard.

Called inside the traced step, each queues a step closure: when the step's values are ready
(the device's, on the device) the value is written through the running
:class:`~csrun.pytorch.utils.data.DataExecutor`'s ``writer`` at ``writer.base_step + step - 1``
(``add_scalar``, or ``add_histogram`` for a tensor). Without a writer the value is dropped, as
on the system; outside an executor's loop the call is refused (there is no step to tie it to).
"""

from __future__ import annotations

from typing import Any

import torch

from csrun.pytorch.utils.data import ExecutorError, current_executor
from csrun.torch import add_step_closure


def _write(kind: str, name: str, value: Any, executor: Any) -> None:
    writer = executor.writer
    if writer is None:
        return
    step = getattr(writer, "base_step", 0) + executor.step - 1
    tensor = torch.as_tensor(value).detach().cpu()
    if kind == "scalar":
        writer.add_scalar(name, float(tensor.float().reshape(-1)[0]), step)
    else:
        writer.add_histogram(name, tensor.float(), step)


def _queue(kind: str, name: str, value: Any) -> None:
    executor = current_executor()
    if executor is None:
        raise ExecutorError(f"cstorch.summarize_{kind}({name!r}, ...) runs inside the traced step of a "
                            f"`for batch in executor:` loop")
    if not isinstance(name, str) or not name:
        raise ExecutorError(f"cstorch.summarize_{kind}: the name must be a non-empty string, got {name!r}")
    add_step_closure(_write, (kind, name, value, executor))


def summarize_scalar(name: str, scalar: Any) -> None:
    """Write the step's ``scalar`` under ``name`` (see the module manual)."""
    _queue("scalar", name, scalar)


def summarize_tensor(name: str, tensor: Any) -> None:
    """Write the step's ``tensor`` as a histogram under ``name`` (see the module manual)."""
    _queue("tensor", name, tensor)


__all__ = ["summarize_scalar", "summarize_tensor"]
