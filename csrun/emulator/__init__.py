"""The wafer emulator: the device that executes compiled programs, in three parts.

- the device API, here: :mod:`~csrun.emulator.device` (the :class:`Device` interface the
  driver talks to), :mod:`~csrun.emulator.embedded` (:class:`EmbeddedDevice`: an engine on a
  worker thread in this process), :mod:`~csrun.emulator.handles` (step handles and device
  tensors, read only in step closures), :mod:`~csrun.emulator.errors`;
- :mod:`csrun.emulator.engine`: the numerics of a step (:class:`Engine`, with the training
  semantics of the device contract in :mod:`csrun.program`);
- :mod:`csrun.emulator.remote`: the link to a ``cs_emulator`` server, both ends
  (:class:`RemoteDevice` is the :class:`Device` over it; the command is :mod:`csrun.cli.cs_emulator`).

The engine knows nothing of the link; the link runs an :class:`EmbeddedDevice` on the server.
Imports are lazy so ``import csrun.emulator`` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Device", "EmbeddedDevice", "RemoteDevice", "Engine", "StepHandle", "DeviceTensor"]

_WHERE = {
    "Device": "csrun.emulator.device",
    "EmbeddedDevice": "csrun.emulator.embedded",
    "RemoteDevice": "csrun.emulator.remote.client",
    "Engine": "csrun.emulator.engine.executor",
    "StepHandle": "csrun.emulator.handles",
    "DeviceTensor": "csrun.emulator.handles",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'csrun.emulator' has no attribute {name!r}")
