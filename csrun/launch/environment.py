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
    env.update(
        CSRUN_LAUNCHER=launcher,
        CSRUN_LAUNCH_MODE=mode,
        CSRUN_TOTAL_TASKS=str(total_tasks),
        CSRUN_TOTAL_NODES=str(total_nodes),
    )
    return env
