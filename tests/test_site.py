"""The site config: YAML, CSRUN_* overrides, and errors that list the valid keys (csrun.typed_config's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from csrun.errors import ConfigError
from csrun.site import SiteConfig, load_site_config, site_environment


def write(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return {"CSRUN_SITE_CONFIG": str(path)}


def test_repo_site_config_is_the_local_cluster() -> None:
    site = load_site_config({})
    assert site.gres_node == "cs-chief"
    assert site.gres_resource == "cs:1"


def test_yaml_values_and_env_override(tmp_path: Path) -> None:
    env = write(tmp_path, "image: /img/cs.sif\nmount_dirs: [/data, /scratch]\ndef_nodes: 3\ngres_node: n0\n")
    site = load_site_config(env)
    assert site == SiteConfig(image="/img/cs.sif", mount_dirs=("/data", "/scratch"), def_nodes=3, gres_node="n0")
    env.update(CSRUN_DEF_NODES="5", CSRUN_MOUNT_DIRS="/a,/b", CSRUN_PARTITION="debug")
    site = load_site_config(env)
    assert (site.def_nodes, site.mount_dirs, site.partition) == (5, ("/a", "/b"), "debug")


def test_unknown_key_lists_valid_keys_with_defaults(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_site_config(write(tmp_path, "def_node: 2\n"))
    text = str(err.value)
    assert "site.yaml: def_node: unknown key. Did you mean 'def_nodes'?" in text
    assert "def_nodes (default 1)" in text and "gres_resource (default 'cs:1')" in text and "account (default '')" in text


@pytest.mark.parametrize(
    "text, needle",
    [
        ("def_cpus_per_task: 0\n", "def_cpus_per_task: 0 must be at least 1"),
        ("def_nodes: many\n", "def_nodes: 'many' must be a whole number"),
        ("def_nodes: true\n", "def_nodes: True must be a whole number"),
        ("gres_resource: cs\n", "gres_resource: 'cs' is not a Slurm GRES such as 'cs:1'"),
        ("mount_dirs: {a: 1}\n", "mount_dirs: {'a': 1} must be a list of str"),
        ("- a\n- b\n", "must be a mapping"),
        ("image: [\n", "not valid YAML"),
    ],
)
def test_bad_values_name_the_value(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_site_config(write(tmp_path, text))
    assert needle in str(err.value)


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="environment CSRUN_DEF_TASKS_PER_NODE: 'x' is not a whole number"):
        load_site_config({"CSRUN_DEF_TASKS_PER_NODE": "x"})


def test_missing_site_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_site_config({"CSRUN_SITE_CONFIG": str(tmp_path / "nope.yaml")})


def test_site_environment_round_trips() -> None:
    site = SiteConfig(image="/i.sif", mount_dirs=("/a", "/b"), def_nodes=4, gres_node="g")
    assert load_site_config({**site_environment(site), "CSRUN_SITE_CONFIG": ""}) == site


def test_env_values_are_checked_like_yaml_values() -> None:
    with pytest.raises(ConfigError, match="environment CSRUN_DEF_NODES: '0' must be at least 1"):
        load_site_config({"CSRUN_DEF_NODES": "0", "CSRUN_SITE_CONFIG": ""})
    with pytest.raises(ConfigError, match="environment CSRUN_GRES_RESOURCE: 'gpu' is not a Slurm GRES"):
        load_site_config({"CSRUN_GRES_RESOURCE": "gpu", "CSRUN_SITE_CONFIG": ""})


def test_site_config_built_in_code_is_checked() -> None:
    with pytest.raises(ConfigError, match="site config.def_nodes: 0 must be at least 1"):
        SiteConfig(def_nodes=0)
