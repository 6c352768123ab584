"""Is there a Slurm to launch on? ``srun`` on PATH and a controller that answers.

Environment: ``CSRUN_SLURM_PROBE_TIMEOUT`` (seconds to wait for ``scontrol ping``, default 5).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass


from csrun.env_settings import env_settings


@dataclass(frozen=True)
class SlurmStatus:
    """Whether Slurm can take a job, and if not, why not (one line for the user)."""

    available: bool
    reason: str = ""


def probe_slurm() -> SlurmStatus:
    """Look for ``srun`` on PATH and ask the controller whether it is up."""
    if shutil.which("srun") is None:
        return SlurmStatus(False, "srun not found on PATH")
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return SlurmStatus(False, "scontrol not found on PATH")
    timeout = env_settings().slurm_probe_timeout
    try:
        done = subprocess.run([scontrol, "ping"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return SlurmStatus(False, f"no Slurm controller answered within {timeout:g}s")
    if done.returncode != 0 or " is UP" not in done.stdout:
        line = (done.stdout.strip() or done.stderr.strip()).splitlines()
        return SlurmStatus(False, f"no Slurm controller answering ({line[-1] if line else 'scontrol ping failed'})")
    return SlurmStatus(True)


def node_cpus(partition: str = "") -> int | None:
    """CPUs per node in the partition (the smallest node), or None when Slurm can't say."""
    argv = ["sinfo", "-h", "-o", "%c"] + ([f"--partition={partition}"] if partition else [])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    counts = [int(w.rstrip("+")) for w in done.stdout.split() if w.rstrip("+").isdigit()]
    return min(counts) if counts else None
