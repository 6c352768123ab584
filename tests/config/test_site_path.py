"""A site-config path the system cannot even look at (issue 45 item 5: ``CSRUN_SITE_CONFIG`` longer
than a file name may be) is one line naming the variable and the reason, exit 2, from every
command that reads the site config; such a path among the places looked at by default is passed over."""

from __future__ import annotations

from pathlib import Path

import pytest

from csrun.cli import python_pt
from csrun.errors import ConfigError
from csrun.site import load_site_config, site_config_path

TOO_LONG = "/tmp/" + "y" * 300


def test_a_site_config_path_too_long_is_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        load_site_config({"CSRUN_SITE_CONFIG": TOO_LONG})
    text = str(err.value)
    assert text.startswith(f"CSRUN_SITE_CONFIG={TOO_LONG!r}: cannot be looked at: File name too long.")
    assert "\n" not in text


def test_python_pt_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CSRUN_SITE_CONFIG", TOO_LONG)
    assert python_pt.main(["-c", "pass"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "File name too long" in err and "Traceback" not in err


def test_a_default_place_too_long_to_look_at_is_passed_over(tmp_path: Path) -> None:
    assert site_config_path({"XDG_CONFIG_HOME": TOO_LONG, "HOME": str(tmp_path)}) in (
        None, Path("/etc/csrun/site.yaml"), Path(__file__).resolve().parents[2] / "configs" / "csrun.yaml")
