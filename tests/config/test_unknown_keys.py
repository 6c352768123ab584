"""Unknown keys are refused the same way in the site config, the params and an input section."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import pytest

from csrun.data import HDF5InputConfig
from csrun.errors import ConfigError
from csrun.run.params import params_from_dict
from csrun.site import load_site_config

LISTING = r"valid keys:\n(  \w+ \((default .+|required)\)(: .+)?\n?)+"
"""The listing every unknown-key error ends with: one line per key, its default and its doc."""

BASE = {"runconfig": {"max_steps": 1, "log_steps": 1}, "model": {"mixed_precision": False},
        "optimizer": {"optimizer_type": "sgd", "learning_rate": 0.1}, "train_input": {"batch_size": 2}}


def site(tmp_path: Path) -> None:
    path = tmp_path / "site.yaml"
    path.write_text("partion: debug\n")
    load_site_config({"CSRUN_SITE_CONFIG": str(path)})


def params_runconfig(tmp_path: Path) -> None:
    params_from_dict({**BASE, "runconfig": {**BASE["runconfig"], "partion": 1}})


def params_input(tmp_path: Path) -> None:
    params_from_dict({**BASE, "train_input": {"batch_size": 2, "partion": 1}})


def data_input(tmp_path: Path) -> None:
    HDF5InputConfig.from_params({"batch_size": 2, "partion": 1}, "eval_input")


@pytest.mark.parametrize("read, where, suggestion", [
    (site, r".*site\.yaml: partion", "partition"),
    (params_runconfig, r"runconfig\.partion", None),
    (params_input, r"train_input\.partion", None),
    (data_input, r"eval_input\.partion", None),
], ids=["site", "params.runconfig", "params.train_input", "data"])
def test_unknown_key_message_has_one_shape(read: Callable[[Path], None], where: str, suggestion: str | None,
                                           tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        read(tmp_path)
    hint = rf" Did you mean '{suggestion}'\?" if suggestion else r"( Did you mean '\w+'\?)?"
    assert re.fullmatch(rf"{where}: unknown key\.{hint}\n{LISTING}", str(err.value)), str(err.value)
    assert err.value.exit_code == 2


def test_listing_names_defaults_and_required_keys() -> None:
    with pytest.raises(ConfigError) as err:
        HDF5InputConfig.from_params({"batch_size": 2, "seed": 1}, "train_input")
    text = str(err.value)
    assert "  batch_size (required): samples per batch" in text
    assert "  shuffle_seed (default 0): seed of the shuffle" in text
    assert "  int_dtype (default 'int64'): integer fields as int64" in text
