"""The input section is modelled once: the runner and the data loader read a YAML section alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

import csrun.data
import csrun.run.params
from csrun.data import HDF5InputConfig, InputConfig, hdf5_dataloader
from csrun.errors import ConfigError
from csrun.run.params import params_from_dict

REPO = Path(__file__).resolve().parents[2]
BERT_DEBUG_DATA = REPO / "models" / "bert" / "data" / "debug_hdf5"
RUN = {"mode": "train", "max_steps": 2, "log_steps": 1}
OPTIMIZER = {"optimizer_type": "sgd", "learning_rate": 0.1}


def through_runner(section: dict[str, Any]) -> HDF5InputConfig:
    """The section read as run.py reads it (params_from_dict, with every check)."""
    params = params_from_dict({"runconfig": RUN, "optimizer": OPTIMIZER, "model": {"mixed_precision": False},
                               "train_input": section}, input_config=HDF5InputConfig)
    assert isinstance(params.train_input, HDF5InputConfig)
    return params.train_input


def through_loader(section: dict[str, Any]) -> HDF5InputConfig:
    """The section read as a standalone input function reads it."""
    return HDF5InputConfig.from_params(section, "train_input")


def test_one_class_for_the_input_section() -> None:
    assert csrun.run.params.InputConfig is csrun.data.InputConfig is InputConfig
    assert issubclass(HDF5InputConfig, InputConfig)
    names = [f.name for f in dataclasses.fields(HDF5InputConfig)]
    assert len(names) == len(set(names))  # no field declared twice
    assert InputConfig(batch_size=1).shuffle_seed == 0 == HDF5InputConfig(batch_size=1).shuffle_seed


def test_a_good_section_reads_the_same_both_ways() -> None:
    section = {"data_dir": str(BERT_DEBUG_DATA), "batch_size": 4, "shuffle_seed": 3, "max_sequence_length": 32,
               "max_predictions_per_seq": 5, "data_processor": "bertHDF5DataProcessor"}
    a, b = through_runner(section), through_loader(section)
    assert a == b and a.data_processor == "BertHDF5DataProcessor"
    batch = next(iter(hdf5_dataloader(a, vocab_size=512)))
    assert batch["input_ids"].shape == (4, 32)


@pytest.mark.parametrize("change, message", [
    ({"bacth_size": 4}, r"^train_input\.bacth_size: unknown key\. Did you mean 'batch_size'\?\nvalid keys:\n  data_dir "),
    ({"batch_size": "four"}, r"^train_input\.batch_size: 'four' must be a whole number$"),
    ({"batch_size": 0}, r"^train_input\.batch_size: 0 must be at least 1 \(valid: at least 1 and at most 1099511627776\)$"),
    ({"shuffle_seed": None}, r"^train_input\.shuffle_seed: None must be a whole number$"),
    ({"max_sequence_length": 0}, r"^train_input\.max_sequence_length: 0 must be at least 1 \(valid: at least 1 and at most "
                                 r"1048576\)$"),
    ({"shuffle_seed": -1e308}, r"^train_input\.shuffle_seed: -1e\+308 must be at least 0$"),
    ({"num_workers": 10**6}, r"^train_input\.num_workers: 1000000 must be at most 128 \(valid: at least 0 and at most 128\)$"),
    ({"data_processor": "Foo"}, r"^train_input\.data_processor: 'Foo' is not one of"),
    ({"int_dtype": "int8"}, r"^train_input\.int_dtype: 'int8' is not one of 'int64', 'stored'$"),
    ({"prefetch_factor": 2}, r"^train_input\.prefetch_factor: needs num_workers > 0"),
])
def test_a_bad_section_fails_the_same_both_ways(change: dict[str, Any], message: str) -> None:
    section = {"data_dir": "d", "batch_size": 4, **change}
    with pytest.raises(ConfigError, match=message) as runner_error:
        through_runner(section)
    with pytest.raises(ConfigError) as loader_error:
        through_loader(section)
    assert str(runner_error.value) == str(loader_error.value)
    assert runner_error.value.exit_code == 2


@pytest.mark.parametrize("name", ["bert_debug", "bert_base_msl128", "gpt2_debug", "fc_mnist_debug"])
def test_bundled_sections_read_as_the_one_model(name: str) -> None:
    data = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    for key in ("train_input", "eval_input"):
        section = dict(data[key])
        section.pop("data_source", None)  # fc_mnist's own key (its subclass adds it)
        config = HDF5InputConfig.from_params(section, key)
        assert config.shuffle_seed == section.get("shuffle_seed", 0)
        assert config.shuffle is section.get("shuffle", True)
