"""csrun.driver.run_path.decide: the one run-path decision, as a table of flags x environment x ClusterInfo."""

from __future__ import annotations

import pytest

from csrun.address import Address, AddressError
from csrun.cluster import ClusterInfo, cluster_info
from csrun.driver.run_path import RunFlags, RunPathError, decide

WSE = {"CSRUN_LAUNCHER": "csrun_wse"}
CPU = {"CSRUN_LAUNCHER": "csrun_cpu"}
REMOTE_ENV = {"CS_IP": "node7"}

# flags, environment (read into ClusterInfo), expected kind, expected address
TABLE = [
    (RunFlags(), {}, "cpu", None),
    (RunFlags(), CPU, "cpu", None),
    (RunFlags(), WSE, "embedded", None),
    (RunFlags(), REMOTE_ENV, "remote", "node7:9000"),
    (RunFlags(), {**WSE, "CS_IP": "node7:9100"}, "remote", "node7:9100"),
    (RunFlags(), {**WSE, "CS_IP": "embedded"}, "embedded", None),
    (RunFlags(), {**CPU, "CS_IP": " "}, "cpu", None),  # a blank CS_IP is unset
    (RunFlags(cs_ip="embedded"), {}, "embedded", None),
    (RunFlags(cs_ip="EMBEDDED"), CPU, "embedded", None),
    (RunFlags(cs_ip="h"), {}, "remote", "h:9000"),
    (RunFlags(cs_ip="h:1234"), {**WSE, "CS_IP": "other:1"}, "remote", "h:1234"),  # the flag wins over CS_IP
    (RunFlags(cs_ip="[::1]:9001"), {}, "remote", "[::1]:9001"),
    (RunFlags(cpu=True), {}, "cpu", None),
    (RunFlags(cpu=True), WSE, "cpu", None),  # --cpu wins over the launcher
    (RunFlags(cpu=True, cs_ip="h"), REMOTE_ENV, "cpu", None),  # ... and over cs_ip and CS_IP
    (RunFlags(cpu=True), {"CS_IP": "bad:port"}, "cpu", None),  # CS_IP is not even read
    (RunFlags(compile_only=True), {}, "compile_only", None),
    (RunFlags(compile_only=True), WSE, "compile_only", None),
    (RunFlags(compile_only=True, cs_ip="h"), {}, "compile_only", "h:9000"),
    (RunFlags(compile_only=True), REMOTE_ENV, "compile_only", "node7:9000"),
    (RunFlags(compile_only=True, cpu=True, cs_ip="h"), {}, "compile_only", None),  # compiles even with --cpu
    (RunFlags(validate_only=True), {}, "validate_only", None),
    (RunFlags(validate_only=True, cpu=True), WSE, "validate_only", None),
    (RunFlags(validate_only=True, cs_ip="embedded"), {}, "validate_only", None),
]


@pytest.mark.parametrize("flags,env,kind,address", TABLE)
def test_decision_table(flags: RunFlags, env: dict[str, str], kind: str, address: str | None) -> None:
    path = decide(flags, cluster_info(env))
    assert (path.kind, path.cs_ip) == (kind, address)
    assert path.on_cpu == (kind == "cpu")
    assert path.compiles_only == (kind in ("compile_only", "validate_only"))
    assert path.reason  # every path says why, for the log


def test_the_launcher_comes_from_cluster_info_not_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CSRUN_LAUNCHER", "csrun_cpu")
    monkeypatch.delenv("CS_IP", raising=False)
    info = ClusterInfo(rank=0, num_tasks=1, local_rank=0, node_name="n", launcher="csrun_wse",
                       launch_mode="slurm", job_id="7", cs_ip="")
    assert decide(RunFlags(), info).kind == "embedded"
    info = ClusterInfo(rank=0, num_tasks=1, local_rank=0, node_name="n", launcher="", launch_mode="",
                       job_id="", cs_ip="[::1]:5")
    assert decide(RunFlags(), info).address == Address("::1", 5)


def test_both_compile_flags_are_refused() -> None:
    with pytest.raises(RunPathError, match="^Please set one of compile_only and validate_only$"):
        decide(RunFlags(compile_only=True, validate_only=True), cluster_info({}))


@pytest.mark.parametrize("flags,env,named", [
    (RunFlags(cs_ip="  "), {}, "cs_ip is empty"),
    (RunFlags(cs_ip="h:70000"), {}, "port 70000"),
    (RunFlags(), {"CS_IP": "node7:nine"}, "'nine'"),
])
def test_bad_addresses_are_one_line_errors(flags: RunFlags, env: dict[str, str], named: str) -> None:
    with pytest.raises((RunPathError, AddressError)) as exc:
        decide(flags, cluster_info(env))
    assert named in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("argv,env,named", [
    (["--cs_ip", "h:0"], {}, "argument -cs/--cs_ip: port 0 in the address 'h:0' is out of range"),
    ([], {"CS_IP": "h:x"}, "CS_IP: bad port 'x'"),
])
def test_run_py_refuses_a_bad_address_in_one_line(argv: list[str], env: dict[str, str], named: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from csrun.errors import UsageError
    from csrun.run.cli_args import parse_args

    with pytest.raises(UsageError) as exc:  # run.py prints it as one 'run.py: error: ...' line, exit 2
        parse_args(["-p", "x.yaml", "-m", "train", *argv], environ=env)
    assert exc.value.exit_code == 2 and named in str(exc.value) and "\n" not in str(exc.value)


def test_run_py_records_the_parsed_address() -> None:
    from csrun.run.cli_args import parse_args

    assert parse_args(["-p", "x", "-m", "train", "--cs_ip", "[::1]"], environ={}).cs_ip == "[::1]:9000"
    assert parse_args(["-p", "x", "-m", "train"], environ={"CS_IP": "node7"}).cs_ip == "node7:9000"
    assert parse_args(["-p", "x", "-m", "train", "--cs_ip", "Embedded"], environ={}).cs_ip == "embedded"
