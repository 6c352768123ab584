"""Launcher options, defined once as typed dataclasses, and the legacy-style parser for them.

Each option is a dataclass field declared with :func:`csrun.typed_config.setting` (its doc is
the help text, its bounds the checks; extra metadata says whether it takes a value), and every
value is read by :func:`csrun.typed_config.from_text`, the same typed mechanism that reads the
site config and the params. The parser accepts what the legacy scripts accepted:

* ``--opt val`` and ``--opt=val``;
* dash and underscore spellings (``--alloc-node`` and ``--alloc_node``);
* ``True``/``False`` (any case, also yes/no/1/0) for boolean options that take a value;
* parsing stops at the first word that is not an option: the rest is the command.

Unlike the legacy scripts, an unknown option is an error (exit 2) that lists the valid ones,
and a bad value is one too, naming the value and what the option takes (``option --total-nodes:
'x' is not a whole number (valid: at least 1 and at most 65536)``): each option declares its
range once (whole numbers within Slurm's own limits, a time limit greater than 0, a device
name), and an option that takes a value never takes an empty one (``--time=``).
``--def_*`` style site queries are handled by :data:`SITE_QUERIES`.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from csrun.errors import ConfigError, UsageError
from csrun.help_style import HELP_LINE, OPTIONS_TITLE, VERSION_LINE, help_header, option_line, wrap_help
from csrun.site import MAX_NODES, MAX_PER_NODE, SiteConfig
from csrun.typed_config import field_doc, from_text, setting, valid_range

SBATCH_LOG_DIR = "csrun_logs"
"""Where ``--use-sbatch`` puts the job's logs when ``--log-dir`` is not given."""
DEVICE_PATTERN = r"cpu|cuda(:\d{1,3})?"
"""A device name: what an option with an optional value accepts."""
OPTIONAL_VALUE = re.compile(rf"^({DEVICE_PATTERN})$")
"""What an option with an optional value accepts as its next word (device names)."""
TIME_PATTERN = r"(?=.*[1-9])(\d{1,4}-)?\d{1,7}(:\d{1,2}){0,2}"
"""A Slurm time limit greater than 0: ``MINUTES``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM`` or ``D-HH:MM:SS``."""
MAX_SIGNAL_LEAD_S = 65535
"""The longest ``sbatch --signal=SIG@LEAD`` lead Slurm takes, in seconds."""


def _opt(default: Any, help: str, *, flag: bool = False, optional: str | None = None, min: int | None = None,
         max: int | None = None, pattern: str | None = None, what: str = "") -> Any:
    """A dataclass field that is also a command-line option (a :func:`~csrun.typed_config.setting`).

    ``flag``: takes no value. ``optional``: the value may be left out; then this is the
    value, and the next word is taken as the value only when it matches ``OPTIONAL_VALUE``.
    ``min`` / ``max``: the whole numbers the option takes; ``pattern`` / ``what``: the words a
    text option takes, and what they stand for. An option that takes a value never takes an
    empty one.
    """
    if optional is not None:
        pattern, what = DEVICE_PATTERN, "a device (cpu, cuda or cuda:I)"
    return setting(default, help, min=min, max=max, flag=flag, optional=optional, pattern=pattern, what=what)


@dataclass(kw_only=True)
class CommonOptions:
    """Options both launchers take."""

    mount_dirs: tuple[str, ...] = _opt((), "extra comma-separated paths to bind into the container, added to the site's")
    logging: bool = _opt(True, "True/False: echo the 'Running:'/'Launching:' line")
    dry_run: bool = _opt(False, "print the line that would run and exit 0", flag=True)
    use_sbatch: bool = _opt(False, "submit the command as a batch job instead of running it now", flag=True)
    wait: bool = _opt(False, "with --use-sbatch: block until the job ends and exit with its exit code", flag=True)
    time: str = _opt("", "with --use-sbatch: the job's time limit (Slurm format, e.g. 30 or 01:00:00)",
                     pattern=TIME_PATTERN, what="a Slurm time limit greater than 0 (MINUTES, MM:SS, HH:MM:SS, D-HH, "
                                                "D-HH:MM or D-HH:MM:SS)")
    job_name: str = _opt("", "the job's name in squeue, for the srun step and the --use-sbatch job (default: <launcher>:<script>, e.g. csrun_wse:run.py)")
    log_dir: str = _opt("", "one log file per task, DIR/<job>-<rank>.log (the console keeps the chief's); with "
                            "--use-sbatch also the job's logs, DIR/<job id>/ (default there: csrun_logs)")
    legacy_imports: bool = _opt(False, "let the job's unchanged R1.x scripts import cerebras.framework.torch "
                                       "(and ...core.cb_model): they resolve to csrun.torch for this job only", flag=True)


@dataclass(kw_only=True)
class CpuOptions(CommonOptions):
    """csrun_cpu's options."""

    alloc_node: bool = _opt(True, "True: run through srun on one whole node; False: run right here")
    exclude_gres: bool = _opt(True, "True: keep the job off the node that owns the system's GRES")


@dataclass(kw_only=True)
class WseOptions(CommonOptions):
    """csrun_wse's options."""

    total_nodes: int | None = _opt(None, "nodes for the job (default: the site's def_nodes)", min=1, max=MAX_NODES)
    tasks_per_node: int | None = _opt(None, "tasks per node (default: site, or worked out from --cpus-per-task)", min=1,
                                      max=MAX_PER_NODE)
    cpus_per_task: int | None = _opt(None, "CPUs per task (default: site, or worked out from --tasks-per-node)", min=1,
                                     max=MAX_PER_NODE)
    single_task_nodes: int = _opt(0, "how many nodes run exactly one task; must be less than the number of nodes", min=0,
                                  max=MAX_NODES)
    cyclic: bool = _opt(False, "distribute the worker tasks cyclically (--distribution=cyclic)", flag=True)
    preempt_lead: int = _opt(90, "with --use-sbatch: seconds before the time limit at which the job checkpoints and "
                                 "requeues itself (0: never)", min=0, max=MAX_SIGNAL_LEAD_S)
    emulator: str = _opt("", "[DEVICE] start a cs_emulator for the job on the chief's node (cpu, cuda, cuda:I; default cpu); "
                             "with --num-csx N > 1 no cs_emulator: the N systems run their engines on DEVICE", optional="cpu")
    num_csx: int = _opt(1, "N systems training one model data parallel (a Wafer-Scale Cluster): ranks 1..N are the "
                           "systems (one node and the GRES each), rank N+1 MemoryX, then the streamers; needs "
                           "--total-nodes >= N+3 (the default grows to that); 1: one system, as without it", min=1,
                    max=MAX_NODES)


SITE_QUERIES: dict[str, Callable[[SiteConfig], str]] = {
    "def_nodes": lambda s: str(s.def_nodes),
    "def_tasks": lambda s: str(s.def_tasks_per_node),
    "def_cpus": lambda s: str(s.def_cpus_per_task),
    "singularity": lambda s: s.image,
    "def_mount_dirs": lambda s: ",".join(s.mount_dirs),
    "def_gres": lambda s: s.gres_resource,
    "def_gres_node": lambda s: s.gres_node,
}
"""The legacy ``--def_*`` queries: each prints one site setting and exits."""

OptionsT = TypeVar("OptionsT", bound=CommonOptions)


@dataclass(frozen=True)
class ParsedArgs:
    """What the parser found: the options, a site query if one was asked, help, the command."""

    options: Any
    command: list[str]
    query: str | None = None
    help: bool = False


def _canonical(word: str) -> str:
    return word.lstrip("-").replace("-", "_")


def _spelling(name: str) -> str:
    return "--" + name.replace("_", "-")


def help_text(prog: str, cls: type[CommonOptions], summary: str) -> str:
    """The ``--help`` text: usage, every option with its default (shown once), ``--version``, and
    the site queries; wrapped to the terminal (:func:`csrun.help_style.wrap_help`)."""
    lines = help_header(prog, "[options] COMMAND [ARGS...]", summary, OPTIONS_TITLE)
    for f in dataclasses.fields(cls):
        flag = bool(f.metadata["flag"])
        value = "" if flag else ("[VALUE]" if f.metadata.get("optional") else "VALUE")
        lines.append(option_line(_spelling(f.name), value, field_doc(f), f.default, flag=flag))
    lines += [VERSION_LINE, HELP_LINE]
    lines.append("site queries (print one site setting and exit): " + " ".join("--" + q for q in SITE_QUERIES))
    return wrap_help(lines)


def _value(cls: type, name: str, raw: str) -> Any:
    """Option ``name``'s value read from ``raw`` by the typed mechanism; a bad one (an empty one
    included) is a UsageError naming the value and what the option takes."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    valid = valid_range(f) or f.metadata.get("what")
    takes = f" (valid: {valid})" if valid else f" ({field_doc(f)})"
    try:
        if not raw.strip():
            raise ConfigError(f"{_spelling(name)}: {raw!r} is empty")
        return from_text(cls, name, raw, _spelling(name))
    except ConfigError as exc:
        raise UsageError(f"option {exc.what}" + ("" if valid and valid in exc.what else takes)) from None


def parse_args(argv: list[str], cls: type[OptionsT], prog: str) -> ParsedArgs:
    """Parse ``argv`` into ``cls`` options and the command; raise UsageError for bad input."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if word in ("-h", "--help"):
            return ParsedArgs(options=cls(**values), command=[], help=True)
        if not word.startswith("-") or word == "-":
            break
        key, has_value, inline = word.partition("=")
        name = _canonical(key)
        if name in SITE_QUERIES and not has_value:
            return ParsedArgs(options=cls(**values), command=[], query=name)
        if name not in fields or not key.startswith("--"):
            known = [_spelling(n) for n in fields] + ["--" + q for q in SITE_QUERIES]
            close = difflib.get_close_matches(key.replace("_", "-"), known, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise UsageError(f"unknown option {word!r}.{hint} Valid options: {' '.join(known)} (see {prog} --help)")
        f = fields[name]
        if f.metadata.get("optional") is not None:
            if has_value:
                raw = inline
            elif i + 1 < len(argv) and OPTIONAL_VALUE.match(argv[i + 1]):
                raw = argv[i + 1]
                i += 1
            else:
                raw = f.metadata["optional"]
            values[name] = _value(cls, name, raw)
            i += 1
            continue
        if f.metadata["flag"]:
            if has_value:
                values[name] = _value(cls, name, inline)
            else:
                values[name] = True
            i += 1
            continue
        if has_value:
            raw = inline
            i += 1
        else:
            if i + 1 >= len(argv):
                raise UsageError(f"option {word} needs a value ({field_doc(f)})")
            raw = argv[i + 1]
            i += 2
        values[name] = _value(cls, name, raw)
    return ParsedArgs(options=cls(**values), command=list(argv[i:]))
