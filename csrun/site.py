"""The site config: what the legacy admin filled in at the top of csrun_cpu, as one dataclass.

Where it comes from, later winning:

1. the defaults below;
2. one YAML file, the first of these (:func:`site_config_path`; none: the defaults alone):

   a. ``$CSRUN_SITE_CONFIG`` when set (it must exist: a missing one is an error);
   b. the user's, ``$XDG_CONFIG_HOME/csrun/site.yaml`` (``~/.config/csrun/site.yaml`` when
      ``XDG_CONFIG_HOME`` is unset, empty or not an absolute path);
   c. the system's, ``/etc/csrun/site.yaml`` (:data:`SYSTEM_SITE_CONFIG`);
   d. the checkout's, ``configs/csrun.yaml`` beside the ``csrun`` package (a wheel install has
      none);

3. ``CSRUN_<KEY>`` environment variables, one per field (``CSRUN_IMAGE``,
   ``CSRUN_WS_IMAGE``, ``CSRUN_MOUNT_DIRS``, ``CSRUN_DEF_NODES``, ``CSRUN_DEF_TASKS_PER_NODE``,
   ``CSRUN_DEF_CPUS_PER_TASK``, ``CSRUN_GRES_RESOURCE``, ``CSRUN_GRES_NODE``,
   ``CSRUN_SYSTEM_NODES``, ``CSRUN_PARTITION``, ``CSRUN_ACCOUNT``).

The fields are read by :mod:`csrun.typed_config`, the one configuration mechanism: an
unknown key names the file, suggests the closest key and lists the valid keys with their
defaults; a bad value names its key (or variable) and what would be right. Every problem is a
:class:`~csrun.errors.ConfigError` (exit 2).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping


from csrun.env_settings import Variable, env_name, env_settings, shown_default
from csrun.errors import ConfigError
from csrun.yaml_file import read_yaml
from csrun.typed_config import check_fields, from_mapping, from_text, setting

REPO_SITE_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "csrun.yaml"
"""The checkout's site config (the last place looked; a wheel install has none)."""
SYSTEM_SITE_CONFIG = Path("/etc/csrun/site.yaml")
"""The system-wide site config, an admin's (looked at after the user's)."""
USER_SITE_CONFIG = Path("csrun") / "site.yaml"
"""The user's site config, under ``$XDG_CONFIG_HOME`` (default ``~/.config``)."""
MAX_NODES = 1 << 16
"""The most nodes a job asks for (more than a Slurm cluster has)."""
MAX_PER_NODE = 65534
"""The most tasks per node, or CPUs per task: Slurm holds each in 16 bits (65535 means "not set")."""
GRES_PATTERN = r"[A-Za-z][\w.-]*(:[\w.-]+)?:\d+"
"""A Slurm GRES: ``name[:type]:count``."""


@dataclass(frozen=True, kw_only=True)
class SiteConfig:
    """The admin's settings for this cluster (legacy names in brackets)."""

    image: str = setting("", "container image (.sif) python-pt runs in; empty: no container [SINGULARITY_IMAGE]")
    ws_image: str = setting("", "container image (.sif) of the weight-streaming build python-ws runs in; empty: the "
                                "'image' one (a site whose one image holds both builds)")
    mount_dirs: tuple[str, ...] = setting((), "paths bound into the container, comma-separated in env [MOUNT_DIRS]")
    def_nodes: int = setting(1, "nodes csrun_wse uses when --total-nodes is not given [DEF_NODES]", min=1,
                             max=MAX_NODES)
    def_tasks_per_node: int = setting(1, "tasks per node when --tasks-per-node is not given [DEF_TASKS_PER_NODE]", min=1,
                                      max=MAX_PER_NODE)
    def_cpus_per_task: int = setting(1, "CPUs per task when --cpus-per-task is not given [DEF_CPUS_PER_TASK]", min=1,
                                     max=MAX_PER_NODE)
    gres_resource: str = setting("cs:1", "the generic resource that stands for the system, asked for by the chief only [GRES_RESOURCE]",
                                 pattern=GRES_PATTERN, what="a Slurm GRES such as 'cs:1' (name[:type]:count)")
    gres_node: str = setting("", "the node that owns that resource; csrun_cpu keeps off it [GRES_NODE]")
    system_nodes: str = setting("", "the other nodes that hold the resource, as a Slurm hostlist (cs-sys[1-4]): the "
                                    "systems of a csrun_wse --num-csx N cluster; its chief, MemoryX and streamers, "
                                    "and csrun_cpu, keep off them; empty: none named (Slurm's GRES alone places the "
                                    "systems)", pattern=r"[\w.\-\[\],]+", what="a Slurm hostlist such as 'cs-sys[1-4]'")
    partition: str = setting("", "Slurm partition for every job; empty: the cluster's default")
    account: str = setting("", "Slurm account for every job; empty: none given")

    def __post_init__(self) -> None:
        check_fields(self, "site config")


def user_site_config(environ: Mapping[str, str] | None = None) -> Path | None:
    """``$XDG_CONFIG_HOME/csrun/site.yaml``, else ``$HOME/.config/csrun/site.yaml`` (whether it
    exists or not); None when neither variable gives a folder (a mapping without ``HOME``)."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_CONFIG_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / USER_SITE_CONFIG
    home = env.get("HOME", "") or (os.path.expanduser("~") if environ is None else "")
    if not home or home == "~":
        return None
    return Path(home) / ".config" / USER_SITE_CONFIG


def site_config_candidates(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Where the site config is looked for when ``CSRUN_SITE_CONFIG`` is not set, first first:
    the user's, the system's, the checkout's."""
    user = user_site_config(environ)
    return ([user] if user is not None else []) + [SYSTEM_SITE_CONFIG, REPO_SITE_CONFIG]


def site_config_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """The YAML file the site config is read from (module manual: ``CSRUN_SITE_CONFIG``, the
    user's, the system's, the checkout's), or None when only defaults apply."""
    env = os.environ if environ is None else environ
    explicit = env_settings(env).site_config
    if explicit.strip():
        path = Path(explicit)
        why = _not_a_file(path)
        if why:
            raise ConfigError(f"{env_name('site_config')}={explicit!r}: {why}. Point it at a YAML site config or unset it.")
        return path
    return next((path for path in site_config_candidates(environ) if not _not_a_file(path)), None)


def _not_a_file(path: Path) -> str:
    """Why ``path`` is not a file to read (``no such file``, or the system's reason: a name too
    long, a folder not searchable), or ``""`` when it is one."""
    try:
        return "" if path.is_file() else "no such file"
    except OSError as exc:
        return f"cannot be looked at: {exc.strerror or type(exc).__name__}"


def load_site_config(environ: Mapping[str, str] | None = None) -> SiteConfig:
    """Read the site config from its YAML file and the ``CSRUN_*`` overrides."""
    env = os.environ if environ is None else environ
    site = SiteConfig()
    path = site_config_path(env)
    if path is not None:
        data = read_yaml(path, f"site config {path}") or {}
        site = from_mapping(SiteConfig, data, "", source=str(path))
    overrides: dict[str, Any] = {}
    for f in dataclasses.fields(SiteConfig):
        if env_name(f.name) in env:
            overrides[f.name] = from_text(SiteConfig, f.name, env[env_name(f.name)], f"environment {env_name(f.name)}")
    return dataclasses.replace(site, **overrides) if overrides else site


def site_variables() -> tuple[Variable, ...]:
    """The ``CSRUN_<KEY>`` variable of each site config field."""
    return tuple(Variable(env_name(f.name), str(f.metadata["doc"]), "site",
                          ",".join(f.default) if isinstance(f.default, tuple) else shown_default(f.default))
                 for f in dataclasses.fields(SiteConfig))


def site_environment(site: SiteConfig) -> dict[str, str]:
    """The ``CSRUN_*`` variables that carry ``site`` to the tasks a launcher starts."""
    env: dict[str, str] = {}
    for f in dataclasses.fields(SiteConfig):
        value = getattr(site, f.name)
        env[env_name(f.name)] = ",".join(value) if isinstance(value, tuple) else str(value)
    return env
