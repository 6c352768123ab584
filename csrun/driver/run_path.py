"""Which path a run takes, decided once: eager CPU, the embedded emulator, a remote emulator, or a compile.

:func:`decide` is the only place that makes this choice; ``csrun.torch.initialize()`` and
run.py (:mod:`csrun.run.cli_args`) both call it. Inputs: the flags (:class:`RunFlags`: what
``initialize()`` or run.py's command line said) and :class:`~csrun.cluster.ClusterInfo`
(the launcher and the ``CS_IP`` it exported). First matching row wins:

====================================================  ===================  =======================
flags / ClusterInfo                                    kind                 address
====================================================  ===================  =======================
``compile_only`` and ``validate_only``                error: "Please set one of compile_only and validate_only"
``compile_only``                                       ``compile_only``     cs_ip if given (not
                                                                            with ``cpu``), unused
``validate_only``                                      ``validate_only``    as for compile_only
``cpu``                                                ``cpu``              none
``cs_ip="embedded"`` (any case)                        ``embedded``         none
``cs_ip="HOST[:PORT]"``                                ``remote``           parsed, port 9000 if none
no cs_ip, ``info.cs_ip`` (``CS_IP``) set               ``embedded`` /       as for cs_ip
                                                       ``remote``
no cs_ip, ``info.launcher == "csrun_wse"``             ``embedded``         none
otherwise (``csrun_cpu``, plain ``python``)           ``cpu``              none
====================================================  ===================  =======================

``compile_only`` / ``validate_only`` compile (or validate) on the first batch and exit 0 or
1; no device is opened. ``embedded`` runs :class:`~csrun.emulator.embedded.EmbeddedDevice`
in the chief's process; ``remote`` connects a :class:`~csrun.emulator.remote.client.RemoteDevice`
to the ``cs_emulator`` at the address (parsed by :func:`csrun.address.parse_address`: a bad
one is a one-line :class:`~csrun.address.AddressError`). The table applies to the chief;
streamers never open a device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from csrun.address import Address, parse_address
from csrun.cluster import ClusterInfo
from csrun.errors import UserError

EMBEDDED = "embedded"
"""The ``cs_ip`` value that asks for the in-process emulator."""
WSE_LAUNCHER = "csrun_wse"
"""The launcher whose jobs take the device path by default."""

PathKind = Literal["cpu", "embedded", "remote", "compile_only", "validate_only"]
KINDS: tuple[PathKind, ...] = ("cpu", "embedded", "remote", "compile_only", "validate_only")


class RunPathError(UserError):
    """Flags that ask for two paths at once, or an empty device address."""


@dataclass(frozen=True, kw_only=True)
class RunFlags:
    """What the user asked for (``initialize()`` arguments or run.py flags)."""

    cs_ip: str | None = None
    """``HOST[:PORT]``, ``embedded``, or None (then ``CS_IP`` and the launcher decide)."""
    cpu: bool = False
    """Force eager CPU (run.py's ``--cpu``): wins over cs_ip and the launcher."""
    compile_only: bool = False
    """Compile at the first batch and stop."""
    validate_only: bool = False
    """Capture and check at the first batch and stop."""


@dataclass(frozen=True, kw_only=True)
class RunPath:
    """Where the chief runs the steps."""

    kind: PathKind
    """One of :data:`KINDS` (see the module manual)."""
    address: Address | None = None
    """The emulator server's address (``remote``; compile kinds keep a given one), else None."""
    reason: str = ""
    """Why this path, for the log (e.g. ``cs_ip 10.0.0.5:9000``, ``launched by csrun_wse``)."""

    @property
    def cs_ip(self) -> str | None:
        """The address as ``host:port`` text, or None."""
        return None if self.address is None else str(self.address)

    @property
    def on_cpu(self) -> bool:
        """True for eager PyTorch on the CPU (no compile, no device)."""
        return self.kind == "cpu"

    @property
    def compiles_only(self) -> bool:
        """True for ``compile_only`` / ``validate_only``: compile at the first batch, then exit."""
        return self.kind in ("compile_only", "validate_only")


def _target(cs_ip: str, source: str) -> RunPath:
    """The device path for an explicit address (or ``embedded``); ``source`` names where it came from."""
    text = cs_ip.strip()
    if not text:
        raise RunPathError(f"{source} is empty: give HOST[:PORT], 'embedded', or leave it out to run on the CPU")
    if text.lower() == EMBEDDED:
        return RunPath(kind="embedded", reason=f"{source} embedded")
    address = parse_address(text)
    return RunPath(kind="remote", address=address, reason=f"{source} {address}")


def _device(flags: RunFlags, info: ClusterInfo) -> RunPath | None:
    """The device the flags or ``CS_IP`` name, or None when neither names one."""
    if flags.cs_ip is not None:
        return _target(flags.cs_ip, "cs_ip")
    if info.cs_ip:
        return _target(info.cs_ip, "CS_IP")
    return None


def decide(flags: RunFlags, info: ClusterInfo) -> RunPath:
    """The run path for ``flags`` in the job ``info`` describes (the table in the module manual)."""
    if flags.compile_only and flags.validate_only:
        raise RunPathError("Please set one of compile_only and validate_only")
    if flags.compile_only or flags.validate_only:
        kind: PathKind = "compile_only" if flags.compile_only else "validate_only"
        device = None if flags.cpu else _device(flags, info)
        return RunPath(kind=kind, address=None if device is None else device.address, reason=kind)
    if flags.cpu:
        return RunPath(kind="cpu", reason="--cpu")
    device = _device(flags, info)
    if device is not None:
        return device
    if info.launcher == WSE_LAUNCHER:
        return RunPath(kind="embedded", reason="launched by csrun_wse (embedded emulator)")
    return RunPath(kind="cpu", reason="no cs_ip")
