"""Each numeric field declares its valid range once (issue 45 item 6): the typed mechanism
refuses what no field takes (NaN, infinity unless declared, floats beyond float32's range, whole
numbers beyond 64 bits) and what a field's own range excludes, in one line naming the value and
the range; every shipped params file, each numeric key set to such a value, is refused at the
params (no run needed), as are its learning-rate schedules' keys and a model too big to build."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from csrun.errors import ConfigError
from csrun.run.model_size import check_model_size
from csrun.run.params import params_from_dict
from csrun.typed_config import from_mapping, from_text, setting
from tests.models.helpers import CONFIGS, load_module
from tests.run.input_fuzz import MODELS, ODD_VALUES, _leaves, _set, is_nonsense


@dataclass(kw_only=True)
class Knobs:
    """A config with one field of each kind of range."""

    count: int = setting(1, "a count", min=1, max=100)
    rate: float = setting(0.5, "a rate", min=0, below=1)
    scale: float = setting(1.0, "a scale", above=0)
    seed: int = setting(0, "a seed", min=0)
    wait: float = setting(1.0, "a wait that may be endless", above=0, max=3600, finite=False)
    anything: float = setting(0.0, "any finite number")


@pytest.mark.parametrize("key, value, says", [
    ("count", 0, "count: 0 must be at least 1 (valid: at least 1 and at most 100)"),
    ("count", 10**20, "count: 100000000000000000000 must be at most 100 (valid: at least 1 and at most 100)"),
    ("rate", 1.0, "rate: 1.0 must be less than 1 (valid: at least 0 and less than 1)"),
    ("scale", -7, "scale: -7 must be greater than 0"),
    ("scale", math.inf, "scale: inf must be a finite number (valid: greater than 0)"),
    ("anything", -math.inf, "anything: -inf must be a finite number"),
    ("anything", math.nan, "anything: nan is not a number"),
    ("anything", 1e100, "anything: 1e+100 is out of range: a setting's numbers stay within float32's +-3.4e+38"),
    pytest.param("anything", 10**400, "is out of range: a setting's numbers stay within float32's", id="anything-10**400"),
    ("seed", -1e308, "seed: -1e+308 must be at least 0"),
    ("seed", 1e100, "seed: 1e+100 is out of range: a whole number here fits in 64 bits"),
    ("seed", 2**63, "seed: 9223372036854775808 is out of range: a whole number here fits in 64 bits"),
    ("wait", math.nan, "wait: nan is not a number"),
    ("wait", 1e19, "wait: 1e+19 must be at most 3600 (valid: greater than 0 and at most 3600, or inf)"),
])
def test_a_value_out_of_range_is_one_line_naming_it_and_the_range(key: str, value: Any, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping(Knobs, {key: value}, "")
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_declared_ranges_take_their_edges_and_infinity_where_declared() -> None:
    knobs = from_mapping(Knobs, {"count": 100, "rate": 0.0, "seed": 2**63 - 1, "wait": math.inf, "anything": -3.4e38}, "")
    assert (knobs.count, knobs.rate, knobs.seed, knobs.wait) == (100, 0.0, 2**63 - 1, math.inf)
    assert from_text(Knobs, "wait", "inf", "CSRUN_WAIT") == math.inf
    with pytest.raises(ConfigError, match="^CSRUN_X: 'inf' must be a finite number"):
        from_text(Knobs, "scale", "inf", "CSRUN_X")


ALIASES = {"decay_steps": ("steps",), "steps": ("decay_steps",), "initial_learning_rate": ("learning_rate",)}
"""A schedule's keys that it reads under another name (csrun.program.schedules folds the aliases)."""


def _classes(model: str) -> tuple[type, type]:
    """(model config, input config) of a model of models/."""
    module = load_module(model, "model")
    if model == "fc_mnist":
        return module.FcMnistConfig, module.FcMnistInputConfig
    data = load_module(model, "data")
    return ((module.Gpt2Config, data.GptInputConfig) if model == "gpt2" else (module.BertConfig, data.BertInputConfig))


def _read(model: str, data: dict[str, Any]) -> None:
    model_config, input_config = _classes(model)
    params = params_from_dict(data, model_config=model_config, input_config=input_config)
    check_model_size(params.model, meta=model != "fc_mnist")


def test_every_numeric_key_of_every_shipped_params_file_refuses_nonsense() -> None:
    """The fuzzer's params mutations that no key may take (negative, infinite, NaN, beyond float32,
    beyond 64 bits, a wrong type for a number), each file's every leaf, schedules included: each is
    a ConfigError naming the key's path. (The runs themselves: ``python -m tests.run.input_fuzz``.)"""
    accepted, checked = [], 0
    for model, files in MODELS.items():
        for name in files:
            base = yaml.safe_load((CONFIGS / name).read_text())
            _read(model, base)  # the file as shipped reads
            for path, original in _leaves(base):
                for value in ODD_VALUES:
                    if not is_nonsense(original, value):
                        continue
                    data = copy.deepcopy(base)
                    _set(data, path, value)
                    checked += 1
                    try:
                        _read(model, data)
                    except ConfigError as exc:
                        names = {str(path[-1]), *ALIASES.get(str(path[-1]), ())}
                        assert "\n" not in str(exc) and any(n in str(exc) for n in names), (name, path, value, str(exc))
                    else:
                        accepted.append(f"{name} {'.'.join(map(str, path))} = {value!r}")
    assert checked > 1000 and accepted == [], "\n".join(accepted)


@pytest.mark.parametrize("model, key, value", [("fc_mnist", "depth", 1e100), ("fc_mnist", "hidden_size", 10**8),
                                               ("gpt2", "vocab_size", 2**31 - 1), ("bert", "num_hidden_layers", 1025)])
def test_a_model_too_big_to_build_is_refused_from_its_shapes(model: str, key: str, value: Any) -> None:
    data = yaml.safe_load((CONFIGS / MODELS[model][0]).read_text())
    data["model"][key] = value
    if model == "gpt2":
        data["model"]["hidden_size"] = 12 * 2**18  # 12 heads; 2^31 x 3 x 2^20 embeddings: 24 PiB, more than MemoryX
    with pytest.raises(ConfigError) as err:
        _read(model, data)
    says = "must be at most" if key in ("depth", "num_hidden_layers") else "parameters"
    assert str(err.value).startswith(f"model.{key}: " if says != "parameters" else "model: its shapes make")
    assert says in str(err.value) and "\n" not in str(err.value)
