"""Option parsing: every spelling, values, the stop at the first non-option, and bad input."""

from __future__ import annotations

import dataclasses

import pytest

from csrun.errors import UsageError
from csrun.launch.options import SITE_QUERIES, CpuOptions, WseOptions, parse_args


def all_spellings(name: str) -> list[str]:
    return ["--" + name.replace("_", "-"), "--" + name]


@pytest.mark.parametrize("field", [f for f in dataclasses.fields(WseOptions)], ids=lambda f: f.name)
def test_every_wse_option_in_every_spelling(field: dataclasses.Field) -> None:
    value = {"int | None": ("3", 3), "int": ("1", 1), "bool": ("False", False), "str": ("x", "x"), "tuple[str, ...]": ("/a,/b", ("/a", "/b"))}
    raw, expected = value[str(field.type)]
    if field.name == "time":
        raw, expected = "1-00:30", "1-00:30"
    if field.metadata.get("optional"):
        raw, expected = "cuda:1", "cuda:1"
    if field.metadata["flag"]:
        raw, expected = None, True
    for spelling in all_spellings(field.name):
        forms = [[spelling]] if raw is None else [[spelling, raw], [f"{spelling}={raw}"]]
        for form in forms:
            parsed = parse_args([*form, "python-pt", "run.py", "--mode", "train"], WseOptions, "csrun_wse")
            assert getattr(parsed.options, field.name) == expected, form
            assert parsed.command == ["python-pt", "run.py", "--mode", "train"]


@pytest.mark.parametrize("field", [f for f in dataclasses.fields(CpuOptions)], ids=lambda f: f.name)
def test_every_cpu_option_parses(field: dataclasses.Field) -> None:
    if field.metadata["flag"]:
        parsed = parse_args(all_spellings(field.name)[1:] + ["cmd"], CpuOptions, "csrun_cpu")
        assert getattr(parsed.options, field.name) is True
    else:
        raw = {"bool": "false", "str": "v", "tuple[str, ...]": "/d"}[str(field.type)] if field.name != "time" else "30"
        parsed = parse_args([all_spellings(field.name)[1], raw, "cmd"], CpuOptions, "csrun_cpu")
        assert getattr(parsed.options, field.name) not in (field.default,)
    assert parsed.command == ["cmd"]


@pytest.mark.parametrize("word, value", [("True", True), ("true", True), ("YES", True), ("1", True), ("False", False), ("no", False), ("0", False)])
def test_boolean_words(word: str, value: bool) -> None:
    assert parse_args(["--alloc-node", word, "x"], CpuOptions, "csrun_cpu").options.alloc_node is value


def test_parsing_stops_at_first_non_option() -> None:
    parsed = parse_args(["--logging", "False", "python-pt", "--alloc-node", "x"], CpuOptions, "csrun_cpu")
    assert parsed.options.logging is False and parsed.options.alloc_node is True
    assert parsed.command == ["python-pt", "--alloc-node", "x"]
    assert parse_args(["--", "--not-an-option"], CpuOptions, "csrun_cpu").command == ["--not-an-option"]


@pytest.mark.parametrize("query", list(SITE_QUERIES))
def test_site_queries(query: str) -> None:
    assert parse_args([f"--{query}"], CpuOptions, "csrun_cpu").query == query


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--bogus", "x"], "unknown option '--bogus'"),
        (["--total-node", "3", "x"], "Did you mean --total-nodes?"),
        (["-x", "cmd"], "unknown option '-x'"),
        (["--total-nodes", "three", "x"], "--total-nodes: 'three' is not a whole number"),
        (["--total-nodes", "0", "x"], "--total-nodes: '0' must be at least 1"),
        (["--single-task-nodes", "-1", "x"], "--single-task-nodes: '-1' must be at least 0"),
        (["--logging", "maybe", "x"], "--logging: 'maybe' is not yes or no (1/0, true/false, yes/no, on/off)"),
        (["--cyclic=perhaps", "x"], "--cyclic: 'perhaps' is not yes or no"),
        (["--tasks-per-node"], "option --tasks-per-node needs a value"),
    ],
)
def test_bad_input_names_the_value(argv: list[str], needle: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_args(argv, WseOptions, "csrun_wse")
    assert needle in str(err.value)
    assert err.value.exit_code == 2


def test_emulator_device_is_optional() -> None:
    parsed = parse_args(["--emulator", "python-pt", "run.py"], WseOptions, "csrun_wse")
    assert parsed.options.emulator == "cpu" and parsed.command == ["python-pt", "run.py"]
    parsed = parse_args(["--emulator", "cuda", "python-pt"], WseOptions, "csrun_wse")
    assert parsed.options.emulator == "cuda" and parsed.command == ["python-pt"]
    assert parse_args(["--emulator=cuda:0", "x"], WseOptions, "csrun_wse").options.emulator == "cuda:0"
    assert parse_args(["x"], WseOptions, "csrun_wse").options.emulator == ""
    with pytest.raises(UsageError, match="'tpu' is not a device"):
        parse_args(["--emulator=tpu", "x"], WseOptions, "csrun_wse")


def test_help_shows_each_default_once() -> None:
    from csrun.launch.options import CpuOptions, WseOptions, help_text

    for cls in (WseOptions, CpuOptions):
        text = help_text("x", cls, "summary")
        for line in text.splitlines():
            assert line.count("default") <= 1, line
        assert "--total-nodes" not in text or "(default: the site's def_nodes)" in text
        assert "(default: None)" not in text and "(default: False)" not in text
