"""What a job leaves on a node, and its removal: at the job's end, after a killed launcher, at the next launch.

A job leaves its state folder (``csrun_job.*``, :mod:`csrun.launch.supervisor`), MPICH's
shared-memory segments in ``/dev/shm`` and, where mpiexec itself was killed, hydra's topology
file in the temporary folder. The supervisor removes them as the job ends
(:func:`clean_shm`: the job's segments, new since it started and mapped by no process).

A ``kill -9`` of ``csrun_wse`` gives the supervisor no chance to. So each launch starts a
**watch** beside it, ``python -m csrun.launch.reaper STATE_DIR`` (:func:`start_watch`: its own
session, no terminal, a small environment), which sleeps on a pidfd of the folder's owner
(:mod:`csrun.launch.owner`) and, the moment the launcher ends without having removed the folder,
waits for the job's processes on this node to end (the tasks end with their launcher:
:mod:`csrun.launch.task`; at most :data:`TASKS_GONE_S`) and removes the job's segments (those
not in the folder's :data:`SHM_BEFORE` list, new since the folder was made, mapped by no process)
and the folder. A launcher that ended normally removed the folder itself: the watch just ends.

The next ``csrun_wse`` on the node removes, before it launches (:func:`reap`), what is left all
the same (a watch killed too, a node that rebooted):

* state folders whose ``owner`` file names a process of this host that is gone;
* ``/dev/shm/mpich_shm_*`` of this user, older than :data:`MIN_AGE_S` and mapped by no process on
  the node (a live job keeps its segments mapped for its whole run);
* ``hydra_hwloc_*`` files of this user in the temporary folder, older than :data:`MIN_AGE_S`,
  while no ``mpiexec`` / ``hydra_pmi_proxy`` of this user runs on the node (only a hydra process
  reads them).

Nothing that a live process could own is touched; what could not be proved dead stays.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from csrun.launch.owner import read_owner

MIN_AGE_S = 60.0
"""Files younger than this are never reaped (a job may be creating them right now)."""
HYDRA = ("mpiexec", "mpiexec.hydra", "hydra_pmi_proxy")
SHM = Path("/dev/shm")
SHM_BEFORE = "shm.before"
"""In a state folder: the MPICH segments that existed before the job started, one name a line."""
TASKS_GONE_S = 10.0
"""How long a watch waits for a killed launcher's tasks on this node to end before it removes what they used."""


def mapped_files() -> set[str]:
    """Every file some process on this node has mapped (from /proc/*/maps)."""
    mapped: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    mapped.add(line.split(None, 5)[-1].replace(" (deleted)", ""))
        except OSError:
            continue
    return mapped


def unlink_all(paths: list[Path]) -> list[Path]:
    """Delete ``paths`` (those already gone or not removable are skipped); returns the ones deleted."""
    removed = []
    for path in paths:
        try:
            path.unlink()
            removed.append(path)
        except OSError:
            continue
    return removed


def remove_unmapped(paths: list[Path]) -> list[Path]:
    """Delete those of ``paths`` (shared-memory files) that no process on this node maps; returns them."""
    if not paths:
        return []
    mapped = mapped_files()
    return unlink_all([p for p in paths if str(p) not in mapped])


def shm_names() -> set[str]:
    """The MPICH segments in ``/dev/shm`` now (names)."""
    try:
        return {p.name for p in SHM.glob("mpich_shm_*")}
    except OSError:
        return set()


def clean_shm(since: float, before: set[str]) -> list[str]:
    """Remove this job's orphaned MPICH segments: ``/dev/shm/mpich_shm_*`` of this user, new since
    ``since`` (not in ``before``), and mapped by no process. Returns the names removed."""
    try:
        candidates = [p for p in SHM.glob("mpich_shm_*") if p.name not in before]
    except OSError:
        return []
    mine = []
    for path in candidates:
        try:
            st = path.stat()
        except OSError:
            continue
        if st.st_uid == os.getuid() and st.st_mtime >= since - 1:
            mine.append(path)
    return [p.name for p in remove_unmapped(mine)]


def _dead_owner(folder: Path) -> bool:
    owner = read_owner(folder)
    return owner is not None and owner.here and not owner.alive()


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


def note_shm_before(state_dir: str, names: set[str]) -> None:
    """Record in ``state_dir`` the segments that are not the job's (for its watch)."""
    try:
        (Path(state_dir) / SHM_BEFORE).write_text("".join(f"{n}\n" for n in sorted(names)))
    except OSError:
        pass


def start_watch(state_dir: str) -> subprocess.Popen[bytes] | None:
    """Start the watch of ``state_dir``'s launcher (this process; module manual); None if it cannot start."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": package_root}
    try:
        return subprocess.Popen([sys.executable, "-m", "csrun.launch.reaper", state_dir], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, cwd="/")
    except OSError:
        return None


def _job_processes_here(state: Path) -> list[int]:
    """The pids of the job's commands and wrappers on this node that still run (from ``start.*``)."""
    left = []
    for path in state.glob("start.*"):
        try:
            words = path.read_text().split()
            pids = [int(words[0]), int(words[1])]
        except (OSError, ValueError, IndexError):
            continue
        left += [pid for pid in pids if _runs_in(pid, state)]
    return left


def _runs_in(pid: int, state: Path) -> bool:
    """Whether ``pid`` is a live process of the job of ``state`` (its environment names the folder)."""
    try:
        environ = (Path("/proc") / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return f"CSRUN_JOB_STATE={state}".encode() in environ.split(b"\0")


def after_launcher(state_dir: str, tasks_gone_s: float = TASKS_GONE_S) -> list[str]:
    """The watch: wait for ``state_dir``'s launcher to end; if the folder is still there, remove what
    the job left (module manual). Returns what it removed (segment names, then the folder)."""
    state = Path(state_dir)
    owner = read_owner(state)
    pidfd = owner.open() if owner is not None else None
    if pidfd is not None:
        select.select([pidfd], [], [])
        os.close(pidfd)
    elif owner is None or not owner.here:
        return []  # not a folder this node's launcher owns
    if not state.is_dir():
        return []  # the launcher cleaned up after its job
    deadline = time.monotonic() + tasks_gone_s
    while _job_processes_here(state) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        before = set((state / SHM_BEFORE).read_text().split())
        since = (state / SHM_BEFORE).stat().st_mtime
    except OSError:
        before, since = shm_names(), time.time()  # no list: keep every segment there is
    removed = clean_shm(since, before)
    shutil.rmtree(state, ignore_errors=True)
    return [*removed, str(state)]


def main(argv: list[str] | None = None) -> int:
    """``python -m csrun.launch.reaper STATE_DIR``: the watch of one job (module manual)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m csrun.launch.reaper STATE_DIR", file=sys.stderr)
        return 2
    after_launcher(args[0])
    return 0


__all__ = ["MIN_AGE_S", "SHM", "after_launcher", "clean_shm", "note_shm_before", "reap", "remove_unmapped",
           "shm_names", "start_watch", "unlink_all"]


if __name__ == "__main__":
    sys.exit(main())
