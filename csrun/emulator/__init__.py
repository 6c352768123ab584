"""The wafer emulator: the device that executes compiled programs.

- :mod:`~csrun.emulator.engine`: executes one program (forward via the captured graph, backward,
  optimizer, LR schedule, loss scaling, clipping) with all state resident on a device;
- :mod:`~csrun.emulator.precision`, :mod:`~csrun.emulator.loss_scaling`: the pieces it runs
  (with the training semantics of the device contract: the optimizers of
  :mod:`csrun.program.optimizer_classes`, the LR schedules of :mod:`csrun.program.schedules`,
  the clipping of :mod:`csrun.program.clipping`);
- :mod:`~csrun.emulator.device`: the :class:`Device` interface csrun.torch uses, implemented by
  :class:`EmbeddedDevice` (a worker thread in this process) and :class:`RemoteDevice` (a
  ``cs_emulator`` server, :mod:`~csrun.emulator.server`, over :mod:`~csrun.emulator.wire`);
- :mod:`~csrun.emulator.handles`: step handles and device tensors (read only in step closures);
- :mod:`~csrun.emulator.program`: programs to and from bytes, read as data (:mod:`csrun.program.archive`);
- :mod:`~csrun.emulator.cli`: the ``cs_emulator`` command.

Imports are lazy so ``import csrun.emulator`` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Device", "EmbeddedDevice", "RemoteDevice", "Engine", "StepHandle", "DeviceTensor"]

_WHERE = {
    "Device": "csrun.emulator.device",
    "EmbeddedDevice": "csrun.emulator.embedded",
    "RemoteDevice": "csrun.emulator.client",
    "Engine": "csrun.emulator.engine",
    "StepHandle": "csrun.emulator.handles",
    "DeviceTensor": "csrun.emulator.handles",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'csrun.emulator' has no attribute {name!r}")
