"""The site config: what the legacy admin filled in at the top of csrun_cpu, as one dataclass.

Where it comes from, later winning:

1. the defaults below;
2. the YAML file ``$CSRUN_SITE_CONFIG`` if set (it must exist), else ``configs/csrun.yaml``
   beside the ``csrun`` package (the repository's copy) when present;
3. ``CSRUN_<KEY>`` environment variables, one per field (``CSRUN_IMAGE``,
   ``CSRUN_MOUNT_DIRS``, ``CSRUN_DEF_NODES``, ``CSRUN_DEF_TASKS_PER_NODE``,
   ``CSRUN_DEF_CPUS_PER_TASK``, ``CSRUN_GRES_RESOURCE``, ``CSRUN_GRES_NODE``,
   ``CSRUN_PARTITION``, ``CSRUN_ACCOUNT``).

Unknown keys and bad values raise :class:`~csrun.errors.SiteConfigError` with the list of
valid keys and their defaults.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from csrun.errors import SiteConfigError

REPO_SITE_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "csrun.yaml"
_GRES_PATTERN = re.compile(r"^[A-Za-z][\w.-]*(:[\w.-]+)?:\d+$")


@dataclass(frozen=True, kw_only=True)
class SiteConfig:
    """The admin's settings for this cluster (legacy names in brackets)."""

    image: str = field(default="", metadata={"doc": "container image (.sif) python-pt runs in; empty: no container [SINGULARITY_IMAGE]"})
    mount_dirs: tuple[str, ...] = field(default=(), metadata={"doc": "paths bound into the container, comma-separated in env [MOUNT_DIRS]"})
    def_nodes: int = field(default=1, metadata={"doc": "nodes csrun_wse uses when --total-nodes is not given [DEF_NODES]"})
    def_tasks_per_node: int = field(default=1, metadata={"doc": "tasks per node when --tasks-per-node is not given [DEF_TASKS_PER_NODE]"})
    def_cpus_per_task: int = field(default=1, metadata={"doc": "CPUs per task when --cpus-per-task is not given [DEF_CPUS_PER_TASK]"})
    gres_resource: str = field(default="cs:1", metadata={"doc": "the generic resource that stands for the system, asked for by the chief only [GRES_RESOURCE]"})
    gres_node: str = field(default="", metadata={"doc": "the node that owns that resource; csrun_cpu keeps off it [GRES_NODE]"})
    partition: str = field(default="", metadata={"doc": "Slurm partition for every job; empty: the cluster's default"})
    account: str = field(default="", metadata={"doc": "Slurm account for every job; empty: none given"})

    def __post_init__(self) -> None:
        for name in ("def_nodes", "def_tasks_per_node", "def_cpus_per_task"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SiteConfigError(f"site config: {name}={value!r} must be a whole number >= 1.\n{valid_keys_text()}")
        if self.gres_resource and not _GRES_PATTERN.match(self.gres_resource):
            raise SiteConfigError(
                f"site config: gres_resource={self.gres_resource!r} is not a Slurm GRES such as 'cs:1' (name[:type]:count).\n{valid_keys_text()}"
            )
        for name in ("image", "gres_node", "partition", "account"):
            if not isinstance(getattr(self, name), str):
                raise SiteConfigError(f"site config: {name}={getattr(self, name)!r} must be a string.\n{valid_keys_text()}")
        if not all(isinstance(d, str) and d for d in self.mount_dirs):
            raise SiteConfigError(f"site config: mount_dirs={self.mount_dirs!r} must be a list of paths.\n{valid_keys_text()}")


def valid_keys_text() -> str:
    """The valid site-config keys with their defaults and meaning, one per line."""
    lines = ["valid keys (default): "]
    for f in dataclasses.fields(SiteConfig):
        default = f.default
        shown = ",".join(default) if isinstance(default, tuple) else default
        lines.append(f"  {f.name} ({shown!r}): {f.metadata['doc']}")
    return "\n".join(lines)


def _env_name(key: str) -> str:
    return "CSRUN_" + key.upper()


def _coerce(key: str, raw: Any, source: str) -> Any:
    """Turn a YAML or environment value into the field's type, naming the source on error."""
    kind = {f.name: f.type for f in dataclasses.fields(SiteConfig)}[key]
    if kind == "int":
        if isinstance(raw, bool):
            raise SiteConfigError(f"{source}: {key}={raw!r} must be a whole number >= 1.\n{valid_keys_text()}")
        try:
            return int(str(raw).strip())
        except ValueError:
            raise SiteConfigError(f"{source}: {key}={raw!r} must be a whole number >= 1.\n{valid_keys_text()}") from None
    if kind.startswith("tuple"):
        if raw is None:
            return ()
        if isinstance(raw, str):
            return tuple(p.strip() for p in raw.split(",") if p.strip())
        if isinstance(raw, (list, tuple)):
            return tuple(str(p) for p in raw)
        raise SiteConfigError(f"{source}: {key}={raw!r} must be a list of paths or a comma-separated string.\n{valid_keys_text()}")
    if raw is None:
        return ""
    if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
        raise SiteConfigError(f"{source}: {key}={raw!r} must be a string.\n{valid_keys_text()}")
    return str(raw)


def site_config_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """The YAML file the site config is read from, or None when only defaults apply."""
    env = os.environ if environ is None else environ
    explicit = env.get("CSRUN_SITE_CONFIG", "")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise SiteConfigError(f"CSRUN_SITE_CONFIG={explicit!r}: no such file. Point it at a YAML site config or unset it.")
        return path
    return REPO_SITE_CONFIG if REPO_SITE_CONFIG.is_file() else None


def load_site_config(environ: Mapping[str, str] | None = None) -> SiteConfig:
    """Read the site config from its YAML file and the ``CSRUN_*`` overrides."""
    env = os.environ if environ is None else environ
    keys = [f.name for f in dataclasses.fields(SiteConfig)]
    values: dict[str, Any] = {}
    path = site_config_path(env)
    if path is not None:
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise SiteConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise SiteConfigError(f"{path}: must be a mapping of keys to values.\n{valid_keys_text()}")
        for key, raw in data.items():
            if key not in keys:
                raise SiteConfigError(f"{path}: unknown key {key!r}.\n{valid_keys_text()}")
            values[key] = _coerce(key, raw, str(path))
    for key in keys:
        if _env_name(key) in env:
            values[key] = _coerce(key, env[_env_name(key)], f"environment {_env_name(key)}")
    return SiteConfig(**values)


def site_environment(site: SiteConfig) -> dict[str, str]:
    """The ``CSRUN_*`` variables that carry ``site`` to the tasks a launcher starts."""
    env: dict[str, str] = {}
    for f in dataclasses.fields(SiteConfig):
        value = getattr(site, f.name)
        env[_env_name(f.name)] = ",".join(value) if isinstance(value, tuple) else str(value)
    return env
