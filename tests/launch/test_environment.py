"""The CSRUN_* environment contract the launchers give every task."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from csrun.launch.environment import task_environment
from csrun.site import SiteConfig, load_site_config
from tests.conftest import BIN


def test_contract_variables_and_mount_dirs_merge() -> None:
    site = SiteConfig(mount_dirs=("/data",), gres_node="cs-chief")
    env = task_environment(launcher="csrun_wse", mode="local", site=site, extra_mounts=("/scratch", "/data"), total_tasks=6, total_nodes=3, base={"CS_IP": "h:9000", "PATH": "/bin"})
    assert (env["CSRUN_LAUNCHER"], env["CSRUN_LAUNCH_MODE"], env["CSRUN_TOTAL_TASKS"], env["CSRUN_TOTAL_NODES"]) == ("csrun_wse", "local", "6", "3")
    assert env["CSRUN_MOUNT_DIRS"] == "/data,/scratch" and env["CS_IP"] == "h:9000" and env["PATH"] == "/bin"
    assert load_site_config({**env, "CSRUN_SITE_CONFIG": ""}).mount_dirs == ("/data", "/scratch")
    # local: every task on this machine, listening on loopback only
    assert (env["MPIR_CVAR_CH4_NETMOD"], env["FI_PROVIDER"], env["FI_TCP_IFACE"]) == ("ofi", "tcp", "lo")


def slurm_launch_env(base: dict[str, str]) -> dict[str, str]:
    return task_environment(launcher="csrun_wse", mode="slurm", site=SiteConfig(), extra_mounts=(), total_tasks=2, total_nodes=1, base=base)


def test_slurm_launches_use_ofi_tcp_unless_the_user_chose_a_netmod() -> None:
    env = slurm_launch_env({})
    assert (env["MPIR_CVAR_CH4_NETMOD"], env["FI_PROVIDER"]) == ("ofi", "tcp")
    env = slurm_launch_env({"FI_PROVIDER": "verbs"})
    assert (env["MPIR_CVAR_CH4_NETMOD"], env["FI_PROVIDER"]) == ("ofi", "verbs")
    env = slurm_launch_env({"MPIR_CVAR_CH4_NETMOD": "ucx", "UCX_TLS": "rc,self"})
    assert (env["MPIR_CVAR_CH4_NETMOD"], env["UCX_TLS"]) == ("ucx", "rc,self") and "FI_PROVIDER" not in env
    env = slurm_launch_env({"MPICH_CH4_NETMOD": "ucx"})
    assert "MPIR_CVAR_CH4_NETMOD" not in env and "FI_PROVIDER" not in env


LISTENING = r"""
import os, socket, struct, sys

def listening():
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        cols = line.split()
        if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
            ip = socket.inet_ntoa(struct.pack("<I", int(cols[1].split(":")[0], 16)))
            found.add(f"{ip}:{int(cols[1].split(':')[1], 16)}")
    return found

before = listening()  # inherited from mpiexec's proxy (its control port)
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
os.write(1, ("MPI-LISTENS " + " ".join(sorted(listening() - before)) + chr(10)).encode())  # one write
MPI.COMM_WORLD.Barrier()
"""


def test_a_local_job_listens_on_loopback_only(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    """What MPI opens in a local job's tasks is bound to 127.0.0.1, not to the machine's network."""
    done = subprocess.run([str(BIN / "csrun_wse"), "--total-nodes", "3", sys.executable, "-c", LISTENING],
                          env=no_slurm_env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line.split("] ", 1)[-1] if line.startswith("[rank ") else line for line in done.stdout.splitlines()]
    lines = [line.split()[1:] for line in said if line.startswith("MPI-LISTENS")]  # streamers' lines: "[rank N] ..."
    assert len(lines) == 3
    addresses = [a for line in lines for a in line]
    assert addresses and all(a.startswith("127.0.0.1:") for a in addresses), addresses
