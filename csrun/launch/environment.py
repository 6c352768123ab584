"""The environment contract: the ``CSRUN_*`` variables every task of a launched job sees.

Set by the launchers (srun and mpiexec pass the environment on to every task; each is declared
in :data:`csrun.env_settings.CONTRACT`):

``CSRUN_LAUNCHER``
    ``csrun_cpu`` or ``csrun_wse``.
``CSRUN_LAUNCH_MODE``
    ``slurm`` (tasks started by srun) or ``local`` (no Slurm: a subprocess or mpiexec here).
``CSRUN_TOTAL_TASKS``, ``CSRUN_TOTAL_NODES``
    The size of the job as launched.
``CSRUN_NUM_CSX``, ``CSRUN_SYSTEM_DEVICE``
    csrun_wse ``--num-csx N`` with N > 1 (:func:`cluster_environment`): the number of systems
    (ranks 1..N are the systems, N+1 MemoryX: :mod:`csrun.cluster`) and, with ``--emulator
    DEVICE``, the systems' torch device (unset: cpu). Otherwise both are removed, so a value
    left in the launcher's environment never reaches a one-system job.
``CSRUN_IMAGE``, ``CSRUN_MOUNT_DIRS``, ``CSRUN_DEF_*``, ``CSRUN_GRES_*``, ``CSRUN_PARTITION``, ``CSRUN_ACCOUNT``
    The site config as the launcher saw it; ``CSRUN_MOUNT_DIRS`` includes ``--mount-dirs``.
    python-pt reads them, so a task uses the launcher's settings.

``MPIR_CVAR_CH4_NETMOD``, ``FI_PROVIDER``
    Set to ``ofi`` and ``tcp`` for Slurm launches unless ``MPIR_CVAR_CH4_NETMOD`` or
    ``MPICH_CH4_NETMOD`` is already set (a ``FI_PROVIDER`` of your own is kept). Why: the
    mpich wheel (MPICH 5.0.2) speaks PMI-1 to ``srun --mpi=pmi2``, and Slurm reads one PMI-1
    request with a single 1024-byte ``read()``. With the UCX netmod, MPICH publishes a
    4096-byte business card that is the UCX address followed by whatever heap memory lies
    after it, so some of its PMI segments run past 1024 bytes, depending on the heap, and
    the job dies in MPI_Init ("mpi/pmi2: invalid client request", "UCX ERROR failed to
    unpack address"), now and then. OFI business cards are a few dozen bytes. ``tcp``,
    because with libfabric's default choice a rank that exits non-zero under
    ``python -m mpi4py`` waits for the others before its MPI_Abort ends the job.
    Tasks on one node talk through MPICH's shared memory either way. On an InfiniBand or
    Slingshot cluster set ``FI_PROVIDER`` (``verbs``, ``cxi``) yourself.
``FI_TCP_IFACE``
    ``lo`` for local (mpiexec) launches, with ``ofi`` / ``tcp`` as above: every task runs on this
    machine, so none listens on its network interfaces (the default netmod listened on the
    external one). mpiexec's own control port is hydra's and still listens on all interfaces.

``CS_IP`` passes through untouched.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Mapping

from csrun.env_settings import LAUNCH_MODE, LAUNCHER, LEGACY_IMPORTS, NUM_CSX, SYSTEM_DEVICE, TOTAL_NODES, TOTAL_TASKS
from csrun.site import SiteConfig, site_environment

NETMOD_VARIABLES = ("MPIR_CVAR_CH4_NETMOD", "MPICH_CH4_NETMOD")
"""The variables that choose MPICH's network module; set by the user, they win."""


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
    if mode in ("slurm", "local") and not any(name in env for name in NETMOD_VARIABLES):
        env["MPIR_CVAR_CH4_NETMOD"] = "ofi"
        env.setdefault("FI_PROVIDER", "tcp")
        if mode == "local":  # every task on this machine: they listen on loopback only, not on its network
            env.setdefault("FI_TCP_IFACE", "lo")
    env.update({LAUNCHER.name: launcher, LAUNCH_MODE.name: mode, TOTAL_TASKS.name: str(total_tasks),
                TOTAL_NODES.name: str(total_nodes)})
    return env


def cluster_environment(env: dict[str, str], *, num_csx: int, system_device: str) -> None:
    """Set (in ``env``) the cluster contract of a job of ``num_csx`` systems: ``CSRUN_NUM_CSX`` when
    above 1, ``CSRUN_SYSTEM_DEVICE`` when it is above 1 and ``system_device`` is given (``--emulator
    DEVICE``; the job then has no ``CS_IP``: the systems are its device); else removes them."""
    env.pop(NUM_CSX.name, None)
    env.pop(SYSTEM_DEVICE.name, None)
    if num_csx <= 1:
        return
    env[NUM_CSX.name] = str(num_csx)
    if system_device:
        env[SYSTEM_DEVICE.name] = system_device
        env.pop("CS_IP", None)


LEGACY_SHIM = Path(__file__).resolve().parents[1] / "torch" / "legacy_shim"
"""The folder whose ``cerebras`` package maps the legacy imports onto csrun (``--legacy-imports``)."""


def legacy_imports_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``PYTHONPATH`` with :data:`LEGACY_SHIM` first, and ``CSRUN_LEGACY_IMPORTS=1``: the job's
    ``import cerebras.framework.torch`` resolves to csrun.torch (nothing is installed)."""
    current = env.get("PYTHONPATH", "")
    path = str(LEGACY_SHIM) + (os.pathsep + current if current else "")
    return {"PYTHONPATH": path, LEGACY_IMPORTS.name: "1"}
