"""Every ``CSRUN_*`` environment variable, declared once: the knobs, the launch contract, the shell's.

Three kinds of variable, each declared here with its meaning:

* **Knobs** (:class:`EnvSettings`): what a user or a site sets to tune csrun. Each is a typed
  field read from ``CSRUN_<FIELD>`` (``stream_timeout`` is ``CSRUN_STREAM_TIMEOUT``) by the
  rules of :mod:`csrun.typed_config`, with its default and bounds. :func:`env_settings` reads
  them all in one place; every reader in csrun asks it. An empty value is the default. A bad
  value is one :class:`~csrun.errors.ConfigError` line naming the variable, the value, what it
  means and its default::

      CSRUN_STREAM_TIMEOUT: 'abc' is not a number (seconds the chief waits for a batch ...; default 60; unset it for the default)

  The launchers (``csrun_wse``, ``csrun_cpu``), ``run.py`` and ``cs_emulator`` call
  :func:`check_environment` first, so a bad value stops the job before it takes a node.
* **The launch contract** (:data:`CONTRACT`): what a launcher sets for the tasks it starts
  (``CSRUN_LAUNCHER``, ``CSRUN_TASK_LOG_DIR`` ...); csrun writes and reads them, a user does not
  set them.
* **The shell's** (:data:`SHELL`): read by ``bin/`` and ``slurm/local-cluster`` before Python runs.

The site config's variables (``CSRUN_IMAGE``, ``CSRUN_DEF_NODES`` ...: one per field of
:class:`csrun.site.SiteConfig`) are declared by that class. ``csrun env`` lists every variable
that is set, with what it means, and names a ``CSRUN_*`` that csrun does not know.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from csrun.errors import ConfigError
from csrun.typed_config import from_text, setting

PREFIX = "CSRUN_"
WEEK_S = 7 * 24 * 3600
"""The longest finite wait a knob sets, in seconds (longer ones overflow the waits they feed)."""


def env_name(field_name: str) -> str:
    """The variable of a setting: ``stream_timeout`` -> ``CSRUN_STREAM_TIMEOUT``."""
    return PREFIX + field_name.upper()


@dataclass(frozen=True, kw_only=True)
class EnvSettings:
    """The knobs, one per ``CSRUN_<FIELD>`` variable (module manual)."""

    execution_strategy: Literal["pipeline", "weight_streaming"] | None = setting(
        None, "run.py's --execution_strategy when the flag is not given (python-ws sets weight_streaming)")
    verify_steps: int = setting(
        1, "steps of each program the device checks against eager PyTorch when neither the flag nor the "
           "params give it (0 switches the check off)", min=0)
    verify_every: int = setting(
        0, "the device checks one step in this many against eager PyTorch after each program's first "
           "checked steps, when neither the flag nor the params give it (0: none)", min=0)
    progress: Literal["auto", "bar", "lines"] = setting(
        "auto", "the chief's progress display: a redrawn bar, one line per report, or a bar on a terminal only")
    gc_freeze: bool = setting(True, "a Session freezes the heap built before it out of the garbage collector's scans")
    stream_timeout: float = setting(
        60.0, "seconds the chief waits for a batch before it names the streamer that is late", above=0, finite=False)
    stream_error_grace: float = setting(
        10.0, "seconds a streamer's error report may take to reach the chief before the task ends anyway", above=0,
        finite=False)
    mpi_init_timeout: float = setting(
        120.0, "seconds a task waits in MPI_Init for its peers before it ends with one line", above=0, max=WEEK_S)
    mpi_arrivals: bool = setting(True, "tasks of a node wait asleep for each other before MPI_Init (MPICH's spins)")
    mpi_arrivals_wait: float = setting(
        30.0, "seconds a task waits asleep for the other tasks of its node before MPI_Init", above=0, max=WEEK_S)
    preempt_signal: str = setting(
        "USR1", "the signal Slurm sends before it preempts the job (sbatch --signal); the chief then saves and "
                "requeues", pattern=r"\s*(?i:(SIG)?(USR1|USR2|TERM))\s*", what="a preemption signal: USR1, USR2 or TERM")
    max_idle_requeues: int = setting(
        3, "preemptions in a row without a gained step before the job stops requeueing itself", min=1)
    slurm_probe_timeout: float = setting(
        5.0, "seconds csrun_wse and csrun_cpu wait for the Slurm controller to answer before they run locally",
        above=0, max=WEEK_S)
    emulator_start_timeout: float = setting(
        60.0, "seconds csrun_wse --emulator waits for the job's emulator to listen", above=0, max=WEEK_S)
    connect_timeout: float = setting(
        10.0, "seconds the chief keeps trying to reach the system at --cs_ip", above=0, max=WEEK_S)
    queue_timeout: float | None = setting(
        None, "seconds the chief waits in the queue of a system busy with other jobs before it gives up (0: not at "
              "all; unset: the system's allowance per job before it, cs_emulator --wait-per-job)", min=0, max=WEEK_S)
    emulator_token: str = setting(
        "", "the secret the chief presents to the emulator (csrun_wse --emulator sets one per job); empty: the "
            "token file cs_emulator wrote", secret=True)
    emulator_ca: str = setting("", "PEM file of the CA(s) the chief trusts; set, it speaks TLS to the system")
    emulator_tls_name: str = setting("", "the name the system's certificate must carry (default: the host of --cs_ip)")
    half_emulation: Literal["rounding", "autocast"] | None = setting(
        None, "how the emulator runs float16/bfloat16 programs: float32 kernels with rounding (the CPU's default) "
              "or torch.autocast (a GPU's default)")
    cuda_graph: Literal["auto", "off"] = setting(
        "auto", "auto: on a CUDA device the engine replays each step's forward and backward as a CUDA graph "
                "after 3 warm-up steps; off: every step launches its kernels")
    compiled_step: Literal["off", "on", "graph"] = setting(
        "off", "on: the engine compiles each training program's whole step (forward, backward, clipping, "
               "update) with inductor and runs it from the second step, equal to eager within float32 "
               "rounding; graph: the same captured step without inductor's code generation; off: each step "
               "op by op, bit for bit eager")
    engine_trace: Literal["auto", "off"] = setting(
        "auto", "auto: the engine runs a checked TorchScript trace of the graph's forward; off: the graph as captured")
    site_config: str = setting("", "the site config YAML; empty: the first of ~/.config/csrun/site.yaml "
                                   "($XDG_CONFIG_HOME/csrun/site.yaml), /etc/csrun/site.yaml and the checkout's "
                                   "configs/csrun.yaml, else the defaults")


@dataclass(frozen=True)
class Variable:
    """One ``CSRUN_*`` variable: its name, what it means, who sets it, its default (as text)."""

    name: str
    doc: str
    kind: Literal["knob", "contract", "site", "shell"]
    default: str = ""
    secret: bool = False


# -- the launch contract: set by a launcher for its tasks -----------------------------------------

LAUNCHER = Variable("CSRUN_LAUNCHER", "the launcher that started the task: csrun_cpu or csrun_wse", "contract")
LAUNCH_MODE = Variable("CSRUN_LAUNCH_MODE", "how the tasks were started: slurm (srun/sbatch) or local (mpiexec)",
                       "contract")
TOTAL_TASKS = Variable("CSRUN_TOTAL_TASKS", "the number of tasks of the job", "contract")
TOTAL_NODES = Variable("CSRUN_TOTAL_NODES", "the number of nodes of the job", "contract")
LEGACY_IMPORTS = Variable("CSRUN_LEGACY_IMPORTS", "1: the job runs with --legacy-imports (cerebras.* names)",
                          "contract")
TASK_LOG_DIR = Variable("CSRUN_TASK_LOG_DIR", "the folder each task writes its output to (--log-dir)", "contract")
JOB_LABEL = Variable("CSRUN_JOB_LABEL", "the job's name in task log file names (the Slurm job id, or local-<pid>)",
                     "contract")
JOB_STATE = Variable("CSRUN_JOB_STATE", "the folder where each task records how it exited", "contract")
REQUEUE_FILE = Variable("CSRUN_REQUEUE_FILE", "the file the chief writes to ask the batch script for a requeue",
                        "contract")
NUM_CSX = Variable("CSRUN_NUM_CSX", "the systems of the job's cluster (csrun_wse --num-csx): ranks 1..N are "
                   "systems, N+1 is MemoryX, the rest streamers; unset or 1: one system", "contract")
SYSTEM_DEVICE = Variable("CSRUN_SYSTEM_DEVICE", "the torch device a cluster's system tasks run their engines on "
                         "(cpu, cuda, cuda:I; csrun_wse --num-csx N --emulator DEVICE)", "contract", "cpu")
CONTRACT = (LAUNCHER, LAUNCH_MODE, TOTAL_TASKS, TOTAL_NODES, LEGACY_IMPORTS, TASK_LOG_DIR, JOB_LABEL, JOB_STATE,
            REQUEUE_FILE, NUM_CSX, SYSTEM_DEVICE)
"""What a launcher sets for the tasks it starts (:mod:`csrun.launch.environment`)."""

# -- read by the shell, before Python ---------------------------------------------------------------

SHELL = (
    Variable("CSRUN_PYTHON", "the Python the bin/ commands run (default: the checkout's .venv, else python3)", "shell"),
    Variable("CSRUN_SETUP_PYTHON", "the Python bin/csrun-setup builds the venv from", "shell", "python3.11"),
    Variable("CSRUN_VENV", "the venv bin/csrun-setup builds", "shell", "<repo>/.venv"),
    Variable("CSRUN_SLURM_DIR", "the folder of slurm/local-cluster's cluster (--dir wins)", "shell",
             "<repo>/.slurm-local"),
    Variable("CSRUN_SLURM_START_TIMEOUT", "whole seconds slurm/local-cluster start waits for every node", "shell", "60"),
)
"""Read by ``bin/`` and ``slurm/local-cluster``."""


def knobs() -> tuple[Variable, ...]:
    """The knobs of :class:`EnvSettings` as variables."""
    return tuple(Variable(env_name(f.name), str(f.metadata["doc"]), "knob", shown_default(f.default),
                          bool(f.metadata.get("secret"))) for f in dataclasses.fields(EnvSettings))


def shown_default(value: Any) -> str:
    """A default as a user would write it in the environment (``60``, ``on``, ``auto``; ``""`` for none)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


_CACHE: dict[tuple[tuple[str, str], ...], EnvSettings] = {}


def _read(environ: Mapping[str, str]) -> EnvSettings:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(EnvSettings):
        name = env_name(f.name)
        raw = environ.get(name, "")
        if not raw.strip():
            continue
        try:
            values[f.name] = from_text(EnvSettings, f.name, raw, name)
        except ConfigError as exc:
            what = f"{name}: not a usable value" if f.metadata.get("secret") else exc.what
            default = shown_default(f.default)
            raise ConfigError(f"{what} ({f.metadata['doc']}; {f'default {default}' if default else 'unset by default'}; "
                              "unset it for the default)") from None
    return EnvSettings(**values)


def env_settings(environ: Mapping[str, str] | None = None) -> EnvSettings:
    """The knobs from ``environ`` (default: this process's environment, read again when a
    ``CSRUN_*`` variable changed); a :class:`~csrun.errors.ConfigError` naming a bad one."""
    if environ is not None:
        return _read(environ)
    key = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(PREFIX)))
    found = _CACHE.get(key)
    if found is None:
        found = _read(os.environ)
        _CACHE.clear()
        _CACHE[key] = found
    return found


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Refuse a bad knob now (one :class:`~csrun.errors.ConfigError` line), before any work starts."""
    env_settings(environ)


def unknown_names(names: typing.Iterable[str], known: typing.Iterable[str]) -> list[tuple[str, str | None]]:
    """The ``CSRUN_*`` names among ``names`` that are not ``known``, each with the known one it
    most likely misspells (None when none is close)."""
    known_list = list(known)
    out = []
    for name in sorted(n for n in names if n.startswith(PREFIX) and n not in known_list):
        close = difflib.get_close_matches(name, known_list, n=1, cutoff=0.85)
        out.append((name, close[0] if close else None))
    return out
