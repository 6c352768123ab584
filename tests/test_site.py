"""The site config: YAML, CSRUN_* overrides, and errors that list the valid keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from csrun.errors import SiteConfigError
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
    with pytest.raises(SiteConfigError) as err:
        load_site_config(write(tmp_path, "def_node: 2\n"))
    text = str(err.value)
    assert "unknown key 'def_node'" in text
    assert "def_nodes (1)" in text and "gres_resource ('cs:1')" in text and "account ('')" in text


@pytest.mark.parametrize(
    "text, needle",
    [
        ("def_cpus_per_task: 0\n", "def_cpus_per_task=0 must be a whole number >= 1"),
        ("def_nodes: many\n", "def_nodes='many' must be a whole number >= 1"),
        ("def_nodes: true\n", "def_nodes=True must be a whole number >= 1"),
        ("gres_resource: cs\n", "gres_resource='cs' is not a Slurm GRES"),
        ("mount_dirs: {a: 1}\n", "must be a list of paths"),
        ("- a\n- b\n", "must be a mapping"),
        ("image: [\n", "not valid YAML"),
    ],
)
def test_bad_values_name_the_value(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(SiteConfigError) as err:
        load_site_config(write(tmp_path, text))
    assert needle in str(err.value)


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(SiteConfigError, match="environment CSRUN_DEF_TASKS_PER_NODE: def_tasks_per_node='x'"):
        load_site_config({"CSRUN_DEF_TASKS_PER_NODE": "x"})


def test_missing_site_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SiteConfigError, match="no such file"):
        load_site_config({"CSRUN_SITE_CONFIG": str(tmp_path / "nope.yaml")})


def test_site_environment_round_trips() -> None:
    site = SiteConfig(image="/i.sif", mount_dirs=("/a", "/b"), def_nodes=4, gres_node="g")
    assert load_site_config({**site_environment(site), "CSRUN_SITE_CONFIG": ""}) == site
