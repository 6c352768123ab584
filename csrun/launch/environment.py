"""The environment contract: the ``CSRUN_*`` variables every task of a launched job sees.

Set by the launchers (srun and mpiexec pass the environment on to every task):

``CSRUN_LAUNCHER``
    ``csrun_cpu`` or ``csrun_wse``.
``CSRUN_LAUNCH_MODE``
    ``slurm`` (tasks started by srun) or ``local`` (no Slurm: a subprocess or mpiexec here).
``CSRUN_TOTAL_TASKS``, ``CSRUN_TOTAL_NODES``
    The size of the job as launched.
``CSRUN_IMAGE``, ``CSRUN_MOUNT_DIRS``, ``CSRUN_DEF_*``, ``CSRUN_GRES_*``, ``CSRUN_PARTITION``, ``CSRUN_ACCOUNT``
    The site config as the launcher saw it; ``CSRUN_MOUNT_DIRS`` includes ``--mount-dirs``.
    python-pt reads them, so a task uses the launcher's settings.

``UCX_TLS``
    Set to ``self,sm,tcp`` for Slurm launches unless already set. Under ``srun --mpi=pmi2``
    the mpich wheel's (MPICH 5.0.2) PMI-2 client sends a large UCX business card in segments
    and reads past its buffer ("mpi/pmi2: invalid client request"), so MPI_Init fails or
    hangs; with these transports the card stays small. (The OFI netmod avoids it too, but
    there MPI_Abort after a collective hangs instead of ending the job.) On an InfiniBand
    cluster set ``UCX_TLS`` yourself (e.g. ``self,sm,rc``).

``CS_IP`` passes through untouched.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

from csrun.site import SiteConfig, site_environment


def task_environment(
    *,
    launcher: str,
    mode: str,
    site: SiteConfig,
    extra_mounts: tuple[str, ...],
    total_tasks: int,
    total_nodes: int,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """``base`` (default ``os.environ``) plus the ``CSRUN_*`` contract for one launch."""
    env = dict(os.environ if base is None else base)
    mounts = tuple(dict.fromkeys(site.mount_dirs + extra_mounts))
    env.update(site_environment(dataclasses.replace(site, mount_dirs=mounts)))
    if mode == "slurm":
        env.setdefault("UCX_TLS", "self,sm,tcp")
    env.update(
        CSRUN_LAUNCHER=launcher,
        CSRUN_LAUNCH_MODE=mode,
        CSRUN_TOTAL_TASKS=str(total_tasks),
        CSRUN_TOTAL_NODES=str(total_nodes),
    )
    return env
