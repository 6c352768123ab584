"""The environment report ``csrun env`` prints: what a bug report needs, gathered without side effects.

Sections (each a flat mapping of plain values, so ``--json`` is the same data):

* ``csrun``: version, where the package is, Python version and executable;
* ``packages``: versions of torch, numpy, mpi4py, mpich, h5py, tensorboard, submitit, pyyaml,
  rich (``not installed`` where absent);
* ``mpi``: the MPI library's own version string (read without initialising MPI), ``mpiexec``
  on PATH, the netmod a Slurm launch uses (``MPIR_CVAR_CH4_NETMOD`` / ``MPICH_CH4_NETMOD``
  if you set one, else csrun's default ``ofi``) and ``FI_PROVIDER`` (yours, else ``tcp``);
* ``slurm``: ``srun --version``, whether a controller answers (``scontrol ping``, bounded
  by ``CSRUN_SLURM_PROBE_TIMEOUT``), and the Slurm job/step this runs in, if any;
* ``site``: the site config's file (or ``defaults``), the ``CSRUN_*`` variables that
  override it, and every resulting value;
* ``settings``: every ``CSRUN_*`` knob with the value in effect, ``(set)`` from the environment or
  ``(default)`` (a bad one ``BAD:`` and why, a secret's value hidden), and ``CS_IP`` (the system's
  address run.py uses when ``--cs_ip`` is not given, or ``none``);
* ``gpu``: whether torch sees CUDA, the device count and names, ``nvidia-smi`` on PATH;
* ``environment``: every ``CSRUN_*`` variable that is set, with its value (a secret's hidden),
  its kind and meaning, or ``BAD:`` and why (:mod:`csrun.env_settings`); and the names csrun
  does not know (a misspelt one, with the name it is close to).

Nothing here starts MPI, submits a job or touches a GPU beyond asking torch what it sees.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Any, Mapping

import csrun
from csrun.cli.variables import environment_section, settings_section
from csrun.errors import ConfigError, LaunchError
from csrun.launch.environment import NETMOD_VARIABLES
from csrun.launch.slurm_probe import probe_slurm
from csrun.site import load_site_config, site_config_path

PACKAGES = ("torch", "numpy", "mpi4py", "mpich", "h5py", "tensorboard", "submitit", "pyyaml", "rich")
NOT_INSTALLED = "not installed"

Report = dict[str, dict[str, Any]]


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return NOT_INSTALLED


def _first_line(argv: list[str], timeout: float = 10.0) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"failed: {exc}"
    if done.returncode == 0 and done.stdout.strip():
        return done.stdout.strip().splitlines()[0]
    text = (done.stderr or done.stdout).strip().splitlines()
    return f"exit {done.returncode}: {text[-1] if text else 'no output'}"


def csrun_section() -> dict[str, Any]:
    """csrun's version and location, and the Python running it."""
    return {
        "version": csrun.__version__,
        "location": os.path.dirname(os.path.abspath(csrun.__file__)),
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
    }


def packages_section() -> dict[str, Any]:
    """Installed versions of the packages csrun uses."""
    return {name: _version(name) for name in PACKAGES}


def mpi_library_version() -> str:
    """The MPI library's version string, without initialising MPI (or why it can't be read)."""
    try:
        import mpi4py

        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
        from mpi4py import MPI

        return " ".join(MPI.Get_library_version().split())[:200]
    except Exception as exc:  # ImportError, or a broken MPI library: the report says so
        return f"unavailable ({type(exc).__name__}: {exc})"


def _mpiexec() -> str:
    from csrun.cli.csrun_wse import find_mpiexec

    try:
        return find_mpiexec()
    except LaunchError:
        return "not found (beside this Python or on PATH)"


def mpi_section(env: Mapping[str, str]) -> dict[str, Any]:
    """The MPI library, mpiexec, and the netmod / libfabric provider a Slurm launch uses."""
    chosen = next((f"{name}={env[name]}" for name in NETMOD_VARIABLES if name in env), "")
    return {
        "library": mpi_library_version(),
        "mpiexec": _mpiexec(),
        "netmod": chosen or "ofi (csrun's default for Slurm launches; set MPIR_CVAR_CH4_NETMOD to choose)",
        "FI_PROVIDER": env.get("FI_PROVIDER") or ("tcp (csrun's default with ofi)" if not chosen else "(libfabric's choice)"),
    }


def slurm_section(env: Mapping[str, str]) -> dict[str, Any]:
    """Slurm's version, whether its controller answers, and the job this runs in."""
    srun = shutil.which("srun")
    try:
        status = probe_slurm()
        controller = "answers" if status.available else f"not available: {status.reason}"
    except ConfigError as exc:  # a bad CSRUN_SLURM_PROBE_TIMEOUT: the environment section names it too
        controller = f"not asked: {exc}"
    return {
        "srun": _first_line([srun, "--version"]) if srun else "not on PATH",
        "controller": controller,
        "job_id": env.get("SLURM_JOB_ID", ""),
        "step_id": env.get("SLURM_STEP_ID", ""),
        "nodelist": env.get("SLURM_JOB_NODELIST", ""),
    }


def site_section(env: Mapping[str, str]) -> dict[str, Any]:
    """Where the site config comes from and what it says."""
    try:
        path = site_config_path(env)
        site = load_site_config(env)
    except ConfigError as exc:
        return {"error": str(exc)}
    overrides = sorted(k for k in env if k.startswith("CSRUN_") and k.removeprefix("CSRUN_").lower()
                       in {f.name for f in dataclasses.fields(site)})
    values = {f.name: (list(v) if isinstance(v := getattr(site, f.name), tuple) else v) for f in dataclasses.fields(site)}
    return {"file": str(path) if path else "defaults", "overridden_by": overrides, **values}


def gpu_section() -> dict[str, Any]:
    """What torch sees of CUDA."""
    try:
        import torch
    except ImportError:
        return {"cuda": "torch not installed"}
    available = torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
    return {
        "cuda_available": available,
        "torch_cuda_build": torch.version.cuda or "cpu-only build",
        "device_count": count,
        "devices": [torch.cuda.get_device_name(i) for i in range(count)],
        "nvidia-smi": shutil.which("nvidia-smi") or "not on PATH",
    }


def build_report(env: Mapping[str, str] | None = None) -> Report:
    """Every section of the report (see the module manual)."""
    env = os.environ if env is None else env
    return {
        "csrun": csrun_section(),
        "packages": packages_section(),
        "mpi": mpi_section(env),
        "slurm": slurm_section(env),
        "site": site_section(env),
        "settings": settings_section(env),
        "gpu": gpu_section(),
        "environment": environment_section(env),
    }


def render_text(report: Report) -> str:
    """The report as aligned ``key: value`` lines under a heading per section."""
    lines: list[str] = []
    for section, values in report.items():
        lines.append(f"[{section}]")
        width = max((len(k) for k in values), default=0)
        for key, value in values.items():
            shown = ", ".join(map(str, value)) if isinstance(value, list) else value
            lines.append(f"  {key.ljust(width)}  {shown if shown != '' else '-'}")
    return "\n".join(lines)
