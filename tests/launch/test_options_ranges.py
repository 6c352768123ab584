"""Each launcher option declares its valid range once (issue 45 item 6): a whole number outside
it, a time limit that is not one (``--time=0``, ``--time=``), an empty value for any option that
takes one, is refused in one line naming the value and the range, before Slurm is asked."""

from __future__ import annotations

import dataclasses

import pytest

from csrun.cli import csrun_cpu, csrun_wse
from csrun.errors import UsageError
from csrun.launch.options import CpuOptions, WseOptions, parse_args

INT_OPTIONS = [f for f in dataclasses.fields(WseOptions) if f.type in ("int", "int | None")]
BAD_WHOLE_NUMBERS = ["-7", "inf", "nan", "1e100", "-1e308", "1.5", "ten", str(10**20), str(2**63)]


@pytest.mark.parametrize("field", INT_OPTIONS, ids=lambda f: f.name)
def test_a_whole_number_option_refuses_what_is_out_of_its_range(field: dataclasses.Field) -> None:
    option = "--" + field.name.replace("_", "-")
    least, most = field.metadata["min"], field.metadata["max"]
    assert least is not None and most is not None and most < 2**31, "every whole-number option declares its range"
    for word in [*BAD_WHOLE_NUMBERS, str(least - 1), str(most + 1)]:
        with pytest.raises(UsageError) as err:
            parse_args([f"{option}={word}", "cmd"], WseOptions, "csrun_wse")
        text = str(err.value)
        assert text.startswith(f"option {option}: {word!r} ") and f"valid: at least {least} and at most {most}" in text
        assert "\n" not in text
    for word in (str(least), str(most)):
        assert getattr(parse_args([f"{option}={word}", "cmd"], WseOptions, "csrun_wse").options, field.name) == int(word)


@pytest.mark.parametrize("word", ["0", "00:00:00", "0-0", "-1:00", "ten", "1e100", "10000000000000000000", "1:2:3:4"])
def test_time_refuses_what_is_not_a_limit_greater_than_zero(word: str) -> None:
    with pytest.raises(UsageError, match=rf"^option --time: '{word}' is not a Slurm time limit greater than 0 "):
        parse_args([f"--time={word}", "cmd"], WseOptions, "csrun_wse")


@pytest.mark.parametrize("word", ["30", "0:30", "01:00:00", "2-12", "2-12:30", "2-12:30:00"])
def test_time_takes_each_slurm_form(word: str) -> None:
    assert parse_args(["--time", word, "cmd"], CpuOptions, "csrun_cpu").options.time == word


@pytest.mark.parametrize("cls", [WseOptions, CpuOptions], ids=lambda c: c.__name__)
def test_no_option_that_takes_a_value_takes_an_empty_one(cls: type) -> None:
    for f in dataclasses.fields(cls):
        if f.metadata["flag"]:
            continue
        option = "--" + f.name.replace("_", "-")
        for word in ("", " "):
            with pytest.raises(UsageError, match=rf"^option {option}: '{word}' ") as err:
                parse_args([f"{option}={word}", "cmd"], cls, "x")
            assert "\n" not in str(err.value)


@pytest.mark.parametrize("main, argv, says", [
    (csrun_wse.main, ["--use-sbatch", "--dry-run", "--time=0"], "option --time: '0' is not a Slurm time limit greater than 0"),
    (csrun_cpu.main, ["--use-sbatch", "--dry-run", "--time="], "option --time: '' is empty (valid: a Slurm time limit"),
    (csrun_wse.main, ["--dry-run", "--cpus-per-task", "100000000000000000000"],
     "option --cpus-per-task: '100000000000000000000' must be at most 65534 (valid: at least 1 and at most 65534)"),
], ids=["time=0", "time=", "cpus-per-task"])
def test_the_launchers_refuse_the_issue_examples_in_one_line(main: object, argv: list[str], says: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "python-pt", "run.py"]) == 2  # type: ignore[operator]
    out = capsys.readouterr()
    assert out.err.strip().splitlines() == [out.err.strip()] and says in out.err and "Traceback" not in out.err
    assert "Launching" not in out.out and "#SBATCH" not in out.out


@pytest.mark.parametrize("variable, option", [("CSRUN_DEF_NODES", "total_nodes"),
                                              ("CSRUN_DEF_TASKS_PER_NODE", "tasks_per_node"),
                                              ("CSRUN_DEF_CPUS_PER_TASK", "cpus_per_task")])
def test_the_sites_defaults_take_the_options_ranges(variable: str, option: str) -> None:
    from csrun.errors import ConfigError
    from csrun.site import load_site_config

    most = {f.name: f for f in dataclasses.fields(WseOptions)}[option].metadata["max"]
    assert getattr(load_site_config({variable: str(most)}), variable[6:].lower()) == most
    with pytest.raises(ConfigError, match=rf"^environment {variable}: '{most + 1}' must be at most {most} "):
        load_site_config({variable: str(most + 1)})
