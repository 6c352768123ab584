"""``cstorch.utils.CSConfig``: the appliance's job settings, as far as csrun can honour them.

csrun runs one emulated system whose input workers are the job's streamer tasks, on a
filesystem every task sees. So:

* ``num_csx`` must be 1 (more would take that many emulators with the batch split across them
  and their gradients reduced every step, which csrun does not have);
* ``num_workers_per_csx`` (0: as launched) must equal the streamer tasks the launcher started
  (``csrun_wse --total-nodes N+1`` gives N);
* ``mount_dirs`` must exist (they are seen as they are: nothing is mounted);
* ``disable_version_check`` is accepted (there is no version to check);
* every other field is the appliance's (its management service, weight servers, activation
  servers, job labels and time limit, transfer processes, precision level, debug args) and is
  refused when set to anything but its default, with the csrun way to get it where there is one.

Each refusal is one :class:`CSConfigError` line naming the field, its value and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

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
    "precision_opt_level": "choose the compute type with cstorch.amp.set_half_dtype",
    "debug_args": "csrun has no appliance debug arguments",
    "python_paths": "set PYTHONPATH in the job's environment; every task of the job sees it",
}


@dataclass(kw_only=True)
class CSConfig:
    """The 2.x cluster config (see the module manual for what csrun honours)."""

    num_csx: int = 1
    """Systems to train on; csrun emulates one."""
    num_workers_per_csx: int = 0
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
    precision_opt_level: int | None = None
    """Refused: use cstorch.amp.set_half_dtype."""
    debug_args: Any = None
    """Refused."""

    def check(self, num_streamers: int | None = None) -> None:
        """Refuse what csrun cannot honour; with ``num_streamers`` (the job's) check the workers too."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _FIXES and value not in (None, [], {}, ""):
                raise CSConfigError(f"CSConfig({f.name}={value!r}) is the appliance's: {_FIXES[f.name]}")
        if isinstance(self.num_csx, bool) or not isinstance(self.num_csx, int) or self.num_csx < 1:
            raise CSConfigError(f"CSConfig(num_csx={self.num_csx!r}): give a positive number of systems (1 here)")
        if self.num_csx > 1:
            raise CSConfigError(f"CSConfig(num_csx={self.num_csx}): csrun emulates one system; {self.num_csx} would "
                                f"take {self.num_csx} emulators, the batch split across them and their gradients "
                                f"reduced every step (data parallel), which csrun does not have: use num_csx=1")
        workers = self.num_workers_per_csx
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise CSConfigError(f"CSConfig(num_workers_per_csx={workers!r}): give 0 (as launched) or a positive number")
        if num_streamers is not None and workers and workers != num_streamers:
            raise CSConfigError(f"CSConfig(num_workers_per_csx={workers}) but this job has {num_streamers} streamer "
                                f"task(s): launch with csrun_wse --total-nodes {workers + 1} --tasks-per-node 1 (or "
                                f"leave num_workers_per_csx at 0)")
        for folder in self.mount_dirs or []:
            if not os.path.isdir(folder):
                raise CSConfigError(f"CSConfig(mount_dirs=[..., {folder!r}, ...]): no such folder; csrun mounts "
                                    f"nothing, every task sees the shared filesystem as it is")


__all__ = ["CSConfig", "CSConfigError"]
