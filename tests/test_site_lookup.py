"""Where the site config is found (issue 34, item 7.3): CSRUN_SITE_CONFIG, the user's, the
system's, the checkout's, else the built-in defaults; ``csrun env`` names the file in effect."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from csrun import site
from csrun.errors import ConfigError
from csrun.site import SiteConfig, load_site_config, site_config_path

from tests.conftest import REPO, base_env


@pytest.fixture()
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Five site configs, each naming itself as its gres_node: explicit, user (XDG), user (HOME),
    system, checkout; the system and checkout paths moved into tmp_path."""
    paths = {
        "explicit": tmp_path / "explicit.yaml",
        "xdg": tmp_path / "xdg" / "csrun" / "site.yaml",
        "home": tmp_path / "home" / ".config" / "csrun" / "site.yaml",
        "system": tmp_path / "etc" / "csrun" / "site.yaml",
        "checkout": tmp_path / "checkout" / "configs" / "csrun.yaml",
    }
    for name, path in paths.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"gres_node: {name}\n")
    monkeypatch.setattr(site, "SYSTEM_SITE_CONFIG", paths["system"])
    monkeypatch.setattr(site, "REPO_SITE_CONFIG", paths["checkout"])
    return paths


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"), **extra}


def test_the_first_found_wins_in_the_documented_order(places: dict[str, Path], tmp_path: Path) -> None:
    env = _env(tmp_path, CSRUN_SITE_CONFIG=str(places["explicit"]))
    order = []
    for name in ("explicit", "xdg", "system", "checkout"):
        found = site_config_path(env)
        assert found == places[name], (name, found)
        order.append(load_site_config(env).gres_node)
        if name == "explicit":
            del env["CSRUN_SITE_CONFIG"]
        else:
            places[name].unlink()
    assert order == ["explicit", "xdg", "system", "checkout"]
    assert site_config_path(env) is None
    assert load_site_config(env) == SiteConfig()  # nothing found: the built-in defaults


def test_the_user_file_is_under_home_without_xdg(places: dict[str, Path], tmp_path: Path) -> None:
    env = _env(tmp_path)
    del env["XDG_CONFIG_HOME"]
    assert site_config_path(env) == places["home"]
    assert site_config_path({**env, "XDG_CONFIG_HOME": ""}) == places["home"]  # empty: unset
    assert site_config_path({**env, "XDG_CONFIG_HOME": "relative/dir"}) == places["home"]  # not absolute: ignored
    # XDG_CONFIG_HOME set: ~/.config is not looked at, even when the XDG folder has no file
    places["xdg"].unlink()
    assert site_config_path(_env(tmp_path)) == places["system"]


def test_the_user_file_wins_over_the_system_and_the_variables_over_all(places: dict[str, Path], tmp_path: Path) -> None:
    env = _env(tmp_path, CSRUN_GRES_NODE="n017")
    assert load_site_config(env).gres_node == "n017"
    places["xdg"].write_text("def_nodes: 4\n")
    site_read = load_site_config(_env(tmp_path))
    assert (site_read.def_nodes, site_read.gres_node) == (4, "")  # one file is read, not merged with the system's


def test_a_missing_explicit_file_is_an_error_not_a_fallback(places: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="CSRUN_SITE_CONFIG='/no/such.yaml': no such file"):
        site_config_path(_env(tmp_path, CSRUN_SITE_CONFIG="/no/such.yaml"))


def test_a_bad_user_file_names_itself(places: dict[str, Path], tmp_path: Path) -> None:
    places["xdg"].write_text("def_node: 2\n")
    with pytest.raises(ConfigError) as err:
        load_site_config(_env(tmp_path))
    assert str(places["xdg"]) in str(err.value) and "def_nodes" in str(err.value)


def test_csrun_env_names_the_user_file(tmp_path: Path) -> None:
    """The real lookup in a fresh process: HOME's file is what csrun env reports (no /etc/csrun here)."""
    if site.SYSTEM_SITE_CONFIG.exists():
        pytest.skip(f"{site.SYSTEM_SITE_CONFIG} exists on this machine")
    user = tmp_path / ".config" / "csrun" / "site.yaml"
    user.parent.mkdir(parents=True)
    user.write_text("gres_node: from-home\n")
    env = base_env(HOME=str(tmp_path))
    for name in ("XDG_CONFIG_HOME", "CSRUN_SITE_CONFIG", "CSRUN_GRES_NODE"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "csrun.cli.csrun_main", "env", "--json"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    section = json.loads(done.stdout)["site"]
    assert section["file"] == str(user) and section["gres_node"] == "from-home"
