"""Which path a run takes: the device (embedded or remote emulator), or eager PyTorch on the CPU.

=============================================================  =====================================
``initialize(...)`` / environment on the chief                  path
=============================================================  =====================================
``compile_only=True`` or ``validate_only=True``                compile (or validate) on the first
                                                               batch, print the result, exit 0/1;
                                                               no device is opened
``cs_ip="embedded"``                                           :class:`~csrun.emulator.EmbeddedDevice`
                                                               in this process
``cs_ip=None``, ``CS_IP`` unset, ``CSRUN_LAUNCHER=csrun_wse``  EmbeddedDevice in this process
``cs_ip="HOST[:PORT]"``, or ``cs_ip=None`` with ``CS_IP`` set  :class:`~csrun.emulator.RemoteDevice`
                                                               (port 9000 by default; token from
                                                               ``client_token()``, job id from
                                                               ``SLURM_JOB_ID`` or the pid)
anything else (``csrun_cpu``, plain ``python``)                :class:`~csrun.torch.backend.EagerBackend`
=============================================================  =====================================

``compile_only`` together with ``validate_only`` is refused with the legacy message
"Please set one of compile_only and validate_only". Streamers never open a device: the
table applies to the chief.
"""

from __future__ import annotations

import os
from typing import Mapping

from csrun.errors import UserError

EMBEDDED = "embedded"
"""The ``cs_ip`` value that asks for the in-process emulator."""
DEFAULT_PORT = 9000


class InitializeError(UserError):
    """``initialize()`` was asked for something this run cannot do."""


def choose(cs_ip: str | None, *, compile_only: bool, validate_only: bool,
           env: Mapping[str, str] | None = None) -> tuple[str | None, bool]:
    """``(address or None, embedded)`` for this run, from the arguments and the environment."""
    env = os.environ if env is None else env
    if compile_only and validate_only:
        raise InitializeError("Please set one of compile_only and validate_only")
    if cs_ip is None:
        from_env = env.get("CS_IP", "").strip()
        if from_env:
            cs_ip = from_env
        elif env.get("CSRUN_LAUNCHER", "") == "csrun_wse":
            return None, True
        else:
            return None, False
    cs_ip = str(cs_ip).strip()
    if not cs_ip:
        raise InitializeError("cs_ip is empty: give HOST:PORT, 'embedded', or leave it out to run on the CPU")
    if cs_ip.lower() == EMBEDDED:
        return None, True
    if ":" not in cs_ip:
        cs_ip += f":{DEFAULT_PORT}"
    return cs_ip, False
