"""Who launched a job: the ``owner`` file of its state folder, and a handle on that process.

The launcher's supervisor writes ``owner`` as it makes the state folder
(:func:`csrun.launch.supervisor.make_state_dir`): ``<pid> <host> <pid namespace> <start time>``,
the start time being the process's own (``/proc/<pid>/stat``, clock ticks since boot), so that
a pid the kernel gave to another process since is not taken for the launcher. Two readers:

* every task's wrapper (:mod:`csrun.launch.task`) holds a pidfd of its launcher (:meth:`Owner.open`)
  where it can see it (same host and PID namespace) and ends its command the moment the launcher
  dies, a ``kill -9`` included;
* the reaper (:mod:`csrun.launch.reaper`) removes a state folder whose owner is gone.

An owner file of two words (``<pid> <host>``, an older launcher's) still reads: without its
namespace and start time the owner counts as the process of that pid on this host.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from csrun.task_exits import pid_namespace

OWNER = "owner"
"""The file in a state folder naming its launcher."""


def start_ticks(pid: int) -> str:
    """When process ``pid`` started (``/proc/<pid>/stat`` field 22); ``""`` when there is none."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


@dataclass(frozen=True)
class Owner:
    """A job's launcher: its pid, host, PID namespace and start time (``""``: not recorded)."""

    pid: int
    host: str
    namespace: str = ""
    started: str = ""

    @property
    def here(self) -> bool:
        """Whether this process can see the launcher: the same host and (where recorded) PID namespace."""
        return self.host == socket.gethostname() and self.namespace in ("", pid_namespace())

    def alive(self) -> bool:
        """Whether the launcher still runs (asked here only: see :attr:`here`)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not self.started or start_ticks(self.pid) == self.started

    def open(self) -> int | None:
        """A pidfd of the launcher, readable once it has ended; None where it cannot be watched from
        here (another host or namespace, no ``pidfd_open``) or has ended already."""
        if not self.here or not hasattr(os, "pidfd_open"):
            return None
        try:
            fd = os.pidfd_open(self.pid)
        except OSError:
            return None
        if self.alive():  # checked after opening: the pidfd is of the process that was alive then
            return fd
        os.close(fd)
        return None


def write_owner(folder: str) -> None:
    """Name this process as ``folder``'s owner."""
    me = os.getpid()
    (Path(folder) / OWNER).write_text(f"{me} {socket.gethostname()} {pid_namespace()} {start_ticks(me)}\n")


def read_owner(folder: str | Path) -> Owner | None:
    """``folder``'s owner; None when the file is missing or not one."""
    try:
        words = (Path(folder) / OWNER).read_text().split()
        return Owner(int(words[0]), words[1], *words[2:4])
    except (OSError, ValueError, IndexError, TypeError):
        return None


__all__ = ["OWNER", "Owner", "read_owner", "start_ticks", "write_owner"]
