"""A fuzz of the params file through ``--validate_only``: 200 seeded mutations of the debug
params (values of every type and size, deep nesting, removed and unknown keys, binary and
non-mapping files). Each ends in exit 0 (a params file that makes a model) or exit 2 with one
line naming the bad value; never a traceback, never another exit code, and a model that makes
no sense (``depth < 1``, ``hidden_size < 1``, ``dropout`` outside ``[0, 1)``) is refused."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.run.conftest import DEBUG_YAML

Run = Callable[..., int]
pytestmark = pytest.mark.timeout(600)

ODD_VALUES: list[Any] = [-7, 0, -1, 2**63, 1e308, float("inf"), -0.5, 5.0, "ten", "", None, True, [], {}, [1, [2]],
                         {"a": {"b": {"c": 1}}}, "\x00\x01", "ü" * 300]


def mutations(seed: int = 1234, count: int = 200) -> list[str]:
    """``count`` params texts, each one mutation of the debug params."""
    rng = random.Random(seed)
    base = yaml.safe_load(DEBUG_YAML.read_text())
    leaves = [(section, key) for section, body in base.items() for key in body]
    texts: list[str] = ["", "just a string\n", "- a\n- list\n", "model: [unclosed\n", "{" * 500,
                        "model: " + "{x: " * 400 + "1" + "}" * 400 + "\n", "\xff\xfe binary \x00\x00\n"]
    while len(texts) < count:
        data = yaml.safe_load(DEBUG_YAML.read_text())
        section, key = rng.choice(leaves)
        how = rng.random()
        if how < 0.6:
            data[section][key] = rng.choice(ODD_VALUES)
        elif how < 0.75:
            del data[section][key]
        elif how < 0.9:
            data[section][rng.choice(["depht", "learning_rat", "x", key.upper()])] = rng.choice(ODD_VALUES)
        else:
            data[section] = rng.choice(ODD_VALUES)
        texts.append(yaml.safe_dump(data, allow_unicode=True))
    return texts


def test_two_hundred_mutated_params_files_never_give_a_traceback(fc_mnist: Run, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    params = tmp_path / "params.yaml"
    codes: dict[int, int] = {}
    for i, text in enumerate(mutations()):
        params.write_bytes(text.encode("utf-8", "surrogatepass"))
        rc = fc_mnist("-p", str(params), "-m", "train", "-o", str(tmp_path / f"md{i}"), "--cpu", "--validate_only")
        err = capsys.readouterr().err
        assert "Traceback" not in err, f"mutation {i}:\n{text[:500]}\n{err[-2000:]}"
        assert rc in (0, 2), f"mutation {i} exited {rc}:\n{text[:500]}\n{err[-2000:]}"
        if rc == 2:
            assert len([line for line in err.splitlines() if "error" in line]) == 1, err
        codes[rc] = codes.get(rc, 0) + 1
    assert codes.get(2, 0) > 100 and codes.get(0, 0) > 0  # most mutations are refused, some still make a model


@pytest.mark.parametrize("key, value, says", [("depth", -7, "model.depth: -7 must be at least 1"),
                                              ("hidden_size", 0, "model.hidden_size: 0 must be at least 1"),
                                              ("dropout", 5.0, "model.dropout: 5.0 must be less than 1")])
def test_a_model_that_makes_no_sense_is_refused_with_its_range(fc_mnist: Run, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str], key: str,
                                                                value: Any, says: str) -> None:
    data = yaml.safe_load(DEBUG_YAML.read_text())
    data["model"][key] = value
    params = tmp_path / "p.yaml"
    params.write_text(yaml.safe_dump(data))
    assert fc_mnist("-p", str(params), "-m", "train", "-o", str(tmp_path / "md"), "--cpu", "--validate_only") == 2
    assert says in capsys.readouterr().err
