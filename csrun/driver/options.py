"""What the driver was told: the run path and the compile / device settings (``initialize()``'s arguments)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from csrun.env_settings import env_name, env_settings
from csrun.compiler.settings import CompileSettings
from csrun.driver.run_path import RunPath
from csrun.errors import UserError

VERIFY_ENV = env_name("verify_steps")
VERIFY_EVERY_ENV = env_name("verify_every")


@dataclass(frozen=True, kw_only=True)
class DeviceOptions:
    """What ``initialize()`` was told about the device."""

    path: RunPath = field(default_factory=lambda: RunPath(kind="cpu", reason="not initialized"))
    """The run path :func:`csrun.driver.run_path.decide` chose."""
    settings: CompileSettings | None = None
    """Compile settings (None: ``CompileSettings()`` with the wrapped torch optimizer)."""
    model_dir: str | None = None
    """Where ``cs_<hash>/`` compile directories go (None: ``model_dir`` in the working directory)."""
    compile_dir: str | None = None
    """An explicit compile directory (overrides ``model_dir/cs_<hash>``)."""
    device: str = "cpu"
    """Torch device of the embedded emulator: ``cpu``, ``cuda`` or ``cuda:<i>``."""
    queue_depth: int = 2
    """Steps the chief may run ahead of the device."""
    job_id: str = ""
    """The job id a remote device is told (the Slurm job id; the driver uses the pid when empty)."""
    num_csx: int = 1
    """Systems of the job's cluster (:attr:`csrun.cluster.ClusterInfo.num_csx`); above 1 the device is
    the cluster (:mod:`csrun.emulator.swarm.device`)."""
    verify_steps: int | None = None
    """How many steps of each program the device checks against eager PyTorch (None:
    ``CSRUN_VERIFY_STEPS``, default 1; :mod:`csrun.driver.verify`)."""
    verify_every: int | None = None
    """The device checks one step in this many after those (None: ``CSRUN_VERIFY_EVERY``, default 0: none)."""

    @property
    def cs_ip(self) -> str | None:
        """``HOST:PORT`` of the device (the emulator server), or None."""
        return self.path.cs_ip

    @property
    def embedded(self) -> bool:
        """True when the emulator runs in this process."""
        return self.path.kind == "embedded"

    @property
    def compile_only(self) -> bool:
        """Compile on the first step and stop, without running."""
        return self.path.kind == "compile_only"

    @property
    def validate_only(self) -> bool:
        """Capture and check on the first step and stop, without a full compile."""
        return self.path.kind == "validate_only"

    @property
    def uses_device(self) -> bool:
        """True when the chief compiles for (and maybe runs on) the device."""
        return not self.path.on_cpu


def verify_steps(given: int | None, environ: Mapping[str, str] | None = None) -> int:
    """How many steps of each program to check: ``given``, else ``CSRUN_VERIFY_STEPS``, else 1
    (the first step of every program is checked against eager PyTorch unless told otherwise)."""
    return _count("verify_steps", given, "0 switches the check off", environ)


def verify_every(given: int | None, environ: Mapping[str, str] | None = None) -> int:
    """One step in how many to check later in a run: ``given``, else ``CSRUN_VERIFY_EVERY``, else 0 (none)."""
    return _count("verify_every", given, "0: no sampled check", environ)


def _count(name: str, given: int | None, zero: str, environ: Mapping[str, str] | None) -> int:
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 0:
            raise UserError(f"{name}={given!r}: give a number of steps >= 0 ({zero})")
        return given
    value: int = getattr(env_settings(environ), name)
    return value
