"""initialize() picks the backend by the run path (csrun.driver.run_path.decide) from arguments and environment."""

from __future__ import annotations

from pathlib import Path

import pytest

import csrun.torch as cbtorch
from csrun.address import AddressError
from csrun.driver.driver import DeviceDriver
from csrun.torch.process_state import InitializeError
from tests.device.helpers import train

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("cs_ip,env,kind,address", [
    ("embedded", {}, "embedded", None),
    (None, {"CSRUN_LAUNCHER": "csrun_wse"}, "embedded", None),
    (None, {"CSRUN_LAUNCHER": "csrun_wse", "CS_IP": "node7:9100"}, "remote", "node7:9100"),
    (None, {"CS_IP": "node7"}, "remote", "node7:9000"),
    ("10.0.0.5:1234", {"CSRUN_LAUNCHER": "csrun_wse"}, "remote", "10.0.0.5:1234"),
    (None, {"CSRUN_LAUNCHER": "csrun_cpu"}, "cpu", None),
    (None, {}, "cpu", None),
])
def test_initialize_reads_the_path_from_arguments_and_environment(
        monkeypatch: pytest.MonkeyPatch, cs_ip: str | None, env: dict[str, str], kind: str,
        address: str | None) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    from csrun.torch import process_state as state_mod

    state_mod.reset_for_tests()  # ClusterInfo is read once per process state
    st = cbtorch.initialize(cs_ip)
    assert (st.options.path.kind, st.options.cs_ip) == (kind, address)
    assert isinstance(st.backend, DeviceDriver) == (kind != "cpu")


def test_initialize_picks_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from csrun.torch import process_state as state_mod

    assert isinstance(cbtorch.initialize().backend, cbtorch.EagerBackend) and not cbtorch.use_cs()
    monkeypatch.setenv("CSRUN_LAUNCHER", "csrun_wse")
    state_mod.reset_for_tests()
    st = cbtorch.initialize(queue_depth=3)
    assert isinstance(st.backend, DeviceDriver) and st.options.embedded and st.options.queue_depth == 3
    assert cbtorch.use_cs() and cbtorch.global_step() == 0
    monkeypatch.setenv("CSRUN_LAUNCHER", "csrun_cpu")
    state_mod.reset_for_tests()
    assert isinstance(cbtorch.initialize(compile_only=True).backend, DeviceDriver)
    with pytest.raises(InitializeError, match="Please set one of compile_only and validate_only"):
        cbtorch.initialize(compile_only=True, validate_only=True)
    with pytest.raises(InitializeError, match="queue_depth must be a positive integer"):
        cbtorch.initialize("embedded", queue_depth=0)


@pytest.mark.parametrize("cs_ip,named", [("node7:99999", "99999"), ("node7:x", "'x'"), ("", "cs_ip is empty")])
def test_a_bad_address_is_a_one_line_error_naming_it(cs_ip: str, named: str) -> None:
    with pytest.raises((AddressError, InitializeError)) as exc:
        cbtorch.initialize(cs_ip)
    assert named in str(exc.value) and "\n" not in str(exc.value)


def test_a_cs_ip_where_nothing_listens_fails_before_the_compile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device is reached before the step is compiled, within CSRUN_CONNECT_TIMEOUT."""
    import socket
    import time

    from csrun.emulator.remote.errors import SystemUnreachable

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens here once closed
    monkeypatch.setenv("CSRUN_EMULATOR_TOKEN", "t" * 32)
    monkeypatch.setenv("CSRUN_CONNECT_TIMEOUT", "1.5")
    t0 = time.monotonic()
    with pytest.raises(SystemUnreachable, match=f"127.0.0.1:{port}: nothing answered within 1.5 s"):
        train(f"127.0.0.1:{port}", steps=2, model_dir=str(tmp_path))
    assert time.monotonic() - t0 < 8
    assert not list(tmp_path.glob("cs_*")), "the compile ran before the device was reached"


@pytest.mark.parametrize("value", ["abc", "0", "-3", "inf"])
def test_a_bad_connect_timeout_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from csrun.emulator.remote.connect import connect_timeout
    from csrun.errors import UserError

    monkeypatch.setenv("CSRUN_CONNECT_TIMEOUT", value)
    with pytest.raises(UserError, match=rf"^CSRUN_CONNECT_TIMEOUT: '{value}' (is not a number|must be greater than 0|must be a finite number)( \(valid: [^)]*\))? \(seconds the chief keeps trying"):
        connect_timeout()
