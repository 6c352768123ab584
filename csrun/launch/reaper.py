"""What a killed launcher left behind, removed by the next launch that can prove its owner dead.

A ``kill -9`` of ``csrun_wse`` gives its supervisor no chance to clean up: its state folder
(``csrun_job.*``), MPICH's shared-memory segments in ``/dev/shm`` and hydra's topology files in
the temporary folder stay. The next ``csrun_wse`` on the node removes, before it launches:

* state folders whose ``owner`` file names a process of this host that is gone (the folder's
  own launcher: :func:`csrun.launch.supervisor.make_state_dir` records it);
* ``/dev/shm/mpich_shm_*`` of this user, older than :data:`MIN_AGE_S` and mapped by no process on
  the node (a live job keeps its segments mapped for its whole run);
* ``hydra_hwloc_*`` files of this user in the temporary folder, older than :data:`MIN_AGE_S`,
  while no ``mpiexec`` / ``hydra_pmi_proxy`` of this user runs on the node (only a hydra process
  reads them).

Nothing that a live process could own is touched; what could not be proved dead stays.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Callable

from csrun.launch.supervisor import OWNER, SHM, remove_unmapped, unlink_all

MIN_AGE_S = 60.0
"""Files younger than this are never reaped (a job may be creating them right now)."""
HYDRA = ("mpiexec", "mpiexec.hydra", "hydra_pmi_proxy")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _dead_owner(folder: Path) -> bool:
    try:
        pid_text, host = (folder / OWNER).read_text().split()
        return host == socket.gethostname() and not _alive(int(pid_text))
    except (OSError, ValueError):
        return False


def _old_and_mine(path: Path, now: float, min_age_s: float) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and now - st.st_mtime > min_age_s


def _hydra_running() -> bool:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid == os.getuid() and (proc / "comm").read_text().strip() in HYDRA:
                return True
        except OSError:
            continue
    return False


def reap(folders: tuple[Path, ...] | None = None, *, min_age_s: float = MIN_AGE_S,
         hydra_running: Callable[[], bool] | None = None) -> list[Path]:
    """Remove what killed launchers left (see the module manual) from ``folders`` (default: the
    temporary folder, ``/tmp`` where hydra writes, and the working directory) and ``/dev/shm``;
    ``min_age_s``: files younger are kept; ``hydra_running``: whether a hydra process of this user
    runs (default: look in ``/proc``). Returns what was removed."""
    now = time.time()
    removed: list[Path] = []
    places = folders if folders is not None else tuple(dict.fromkeys(
        (Path(tempfile.gettempdir()), Path("/tmp"), Path.cwd())))
    for place in places:
        for folder in [*place.glob("csrun_job.*"), *place.glob(".csrun_job.*")]:
            if folder.is_dir() and _dead_owner(folder):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    try:
        segments = [p for p in SHM.glob("mpich_shm_*") if _old_and_mine(p, now, min_age_s)]
    except OSError:
        segments = []
    removed += remove_unmapped(segments)
    hydra = [p for place in places for p in place.glob("hydra_hwloc_*") if _old_and_mine(p, now, min_age_s)]
    if hydra and not (hydra_running or _hydra_running)():
        removed += unlink_all(hydra)
    return removed


__all__ = ["MIN_AGE_S", "reap"]
