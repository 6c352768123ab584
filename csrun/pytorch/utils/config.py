"""``cstorch.utils.CSConfig``: the appliance's job settings, as far as csrun can honour them.

csrun runs one emulated system whose input workers are the job's streamer tasks, on a
filesystem every task sees. So:

* ``num_csx`` must equal the job's systems (1, or ``csrun_wse --num-csx N``: a cluster of N
  emulated systems training data parallel, :mod:`csrun.emulator.swarm`); each batch of the
  DataLoader is one system's (``get_streaming_batch_size``), a step takes N of them;
* ``num_workers_per_csx`` (0: as launched) times ``num_csx`` must equal the streamer tasks the
  launcher started (``csrun_wse --total-nodes N+1`` gives N);
* ``mount_dirs`` must exist (they are seen as they are: nothing is mounted);
* ``disable_version_check`` is accepted (there is no version to check);
* ``precision_opt_level`` may be 1, the system's default, which 2.2.1's flow always sets
  (csrun's device computes what the graph says: float32, or the half type with
  ``mixed_precision``); ``debug_args`` may be the appliance's empty
  :class:`~csrun.appliance.run_utils.DebugArgs`, which the flow always passes;
* ``None`` for any field is its default (the flow passes ``runconfig.get(...)``);
* every other field is the appliance's (its management service, weight servers, activation
  servers, job labels and time limit, transfer processes, precision level, debug args) and is
  refused when set to anything but its default, with the csrun way to get it where there is one.

Each refusal is one :class:`CSConfigError` line naming the field, its value and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from csrun.appliance.run_utils import DebugArgs
from csrun.errors import ConfigError

#: A CSConfig field csrun cannot honour: the one :class:`csrun.errors.ConfigError` (exit 2)
#: under the name cstorch scripts catch.
CSConfigError = ConfigError


_FIXES: dict[str, str] = {
    "mgmt_address": "csrun has no management service: the device is the embedded emulator or --cs_ip / CS_IP",
    "mgmt_namespace": "csrun has no management service namespaces",
    "credentials_path": "a cs_emulator is reached with its token (CSRUN_EMULATOR_TOKEN or ~/.csrun/emulator.token)",
    "max_wgt_servers": "csrun keeps all weights on the emulated wafer (pipelined mode): there are no weight servers",
    "num_wgt_servers": "csrun keeps all weights on the emulated wafer (pipelined mode): there are no weight servers",
    "max_act_per_csx": "csrun has no activation servers",
    "job_labels": "name the Slurm job instead (csrun_wse --use-sbatch --job-name NAME)",
    "job_time_sec": "give Slurm the time limit (csrun_wse --use-sbatch --time 01:00:00)",
    "transfer_processes": "csrun transfers weights within the chief's process",
    "job_priority": "give Slurm the priority (sbatch --nice / --qos)",
    "fabric_type_blacklist": "csrun's device has no fabric types to exclude",
    "python_paths": "set PYTHONPATH in the job's environment; every task of the job sees it",
}


_NONE = object()
_DEFAULTS: dict[str, Any] = {"job_priority": "p2"}
"""Appliance fields at the value the 2.2.1 flow always passes (the appliance's default): accepted."""


@dataclass(kw_only=True)
class CSConfig:
    """The 2.x cluster config (see the module manual for what csrun honours)."""

    num_csx: int | None = 1
    """Systems to train on; csrun emulates one."""
    num_workers_per_csx: int | None = 0
    """Input workers per system (0: the streamer tasks the job was launched with)."""
    mount_dirs: list[str] | None = None
    """Folders the workers must see (checked to exist)."""
    python_paths: list[str] | None = None
    """Refused: set PYTHONPATH."""
    disable_version_check: bool = False
    """Accepted; nothing to check."""
    mgmt_address: str | None = None
    """Refused: the appliance's management service."""
    mgmt_namespace: str | None = None
    """Refused."""
    credentials_path: str | None = None
    """Refused: a cs_emulator takes its token."""
    max_wgt_servers: int | None = None
    """Refused (no weight servers)."""
    num_wgt_servers: int | None = None
    """Refused (no weight servers)."""
    max_act_per_csx: int | None = None
    """Refused (no activation servers)."""
    job_labels: list[str] | None = None
    """Refused: label the Slurm job."""
    job_time_sec: int | None = None
    """Refused: Slurm's time limit."""
    transfer_processes: int | None = None
    """Refused."""
    job_priority: str | None = None
    """Refused: Slurm's priority."""
    fabric_type_blacklist: list[str] | None = None
    """Refused."""
    precision_opt_level: int | None = None
    """None or 1 (the system's default); others refused."""
    debug_args: Any = None
    """None or an empty ``DebugArgs``; anything set in it is refused."""

    def check(self, num_streamers: int | None = None, num_systems: int | None = None) -> None:
        """Refuse what csrun cannot honour; with ``num_streamers`` and ``num_systems`` (the job's)
        check the workers and the systems too."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _FIXES and value not in (None, [], {}, "") and _DEFAULTS.get(f.name, _NONE) != value:
                raise CSConfigError(f"CSConfig({f.name}={value!r}) is the appliance's: {_FIXES[f.name]}")
        if self.precision_opt_level not in (None, 1):
            raise CSConfigError(f"CSConfig(precision_opt_level={self.precision_opt_level!r}): csrun's device computes "
                                f"what the graph says (float32, or the half type with backend(mixed_precision=True)); "
                                f"leave runconfig.precision_opt_level at 1")
        if self.debug_args is not None:
            if not isinstance(self.debug_args, DebugArgs):
                raise CSConfigError(f"CSConfig(debug_args={type(self.debug_args).__name__}): csrun takes the "
                                    f"appliance's empty DebugArgs only (cerebras.appliance.run_utils.get_debug_args())")
            if not self.debug_args.is_default():
                raise CSConfigError(f"CSConfig(debug_args: {', '.join(self.debug_args.changed())} set): the appliance "
                                    f"pods' memory requests; give Slurm the memory (sbatch --mem) and remove "
                                    f"runconfig.*_memory_gi")
        if self.num_csx is None:
            self.num_csx = 1
        if self.num_workers_per_csx is None:
            self.num_workers_per_csx = 0
        if isinstance(self.num_csx, bool) or not isinstance(self.num_csx, int) or self.num_csx < 1:
            raise CSConfigError(f"CSConfig(num_csx={self.num_csx!r}): give a positive number of systems")
        if num_systems is not None and self.num_csx != num_systems:
            raise CSConfigError(f"CSConfig(num_csx={self.num_csx}) but this job has {num_systems} system(s): launch it "
                                f"with csrun_wse --num-csx {self.num_csx} (the launcher allocates the systems)")
        workers = self.num_workers_per_csx
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise CSConfigError(f"CSConfig(num_workers_per_csx={workers!r}): give 0 (as launched) or a positive number")
        if num_streamers is not None and workers and workers * self.num_csx != num_streamers:
            per = "" if self.num_csx == 1 else f" x {self.num_csx} systems"
            launch = (f"csrun_wse --total-nodes {workers + 1} --tasks-per-node 1" if self.num_csx == 1 else
                      f"csrun_wse --num-csx {self.num_csx} --total-nodes {self.num_csx + 2 + workers * self.num_csx} "
                      f"--tasks-per-node 1")
            raise CSConfigError(f"CSConfig(num_workers_per_csx={workers}){per} but this job has {num_streamers} "
                                f"streamer task(s): launch with {launch} (or leave num_workers_per_csx at 0)")
        if num_systems is not None and num_systems > 1 and num_streamers is not None \
                and (num_streamers == 0 or num_streamers % num_systems):
            raise CSConfigError(f"CSConfig(num_csx={num_systems}) with {num_streamers} streamer task(s): a cluster "
                                f"streams from the same number of input workers per system, so that each system's "
                                f"batches come from its own; launch {num_systems} x k streamers (csrun_wse "
                                f"--num-csx {num_systems} --total-nodes {num_systems + 3} --tasks-per-node "
                                f"{num_systems}: k = 1)")
        for folder in self.mount_dirs or []:
            if not os.path.isdir(folder):
                raise CSConfigError(f"CSConfig(mount_dirs=[..., {folder!r}, ...]): no such folder; csrun mounts "
                                    f"nothing, every task sees the shared filesystem as it is")


__all__ = ["CSConfig", "CSConfigError"]
