"""initialize() picks the backend by the run path (csrun.driver.run_path.decide) from arguments and environment."""

from __future__ import annotations

import pytest

import csrun.torch as cbtorch
from csrun.address import AddressError
from csrun.torch.device_backend import DeviceBackend
from csrun.torch.state import InitializeError

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
    from csrun.torch import state as state_mod

    state_mod.reset_for_tests()  # ClusterInfo is read once per process state
    st = cbtorch.initialize(cs_ip)
    assert (st.options.path.kind, st.options.cs_ip) == (kind, address)
    assert isinstance(st.backend, DeviceBackend) == (kind != "cpu")


def test_initialize_picks_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from csrun.torch import state as state_mod

    assert isinstance(cbtorch.initialize().backend, cbtorch.EagerBackend) and not cbtorch.use_cs()
    monkeypatch.setenv("CSRUN_LAUNCHER", "csrun_wse")
    state_mod.reset_for_tests()
    st = cbtorch.initialize(queue_depth=3)
    assert isinstance(st.backend, DeviceBackend) and st.options.embedded and st.options.queue_depth == 3
    assert cbtorch.use_cs() and cbtorch.global_step() == 0
    monkeypatch.setenv("CSRUN_LAUNCHER", "csrun_cpu")
    state_mod.reset_for_tests()
    assert isinstance(cbtorch.initialize(compile_only=True).backend, DeviceBackend)
    with pytest.raises(InitializeError, match="Please set one of compile_only and validate_only"):
        cbtorch.initialize(compile_only=True, validate_only=True)
    with pytest.raises(InitializeError, match="queue_depth must be a positive integer"):
        cbtorch.initialize("embedded", queue_depth=0)


@pytest.mark.parametrize("cs_ip,named", [("node7:99999", "99999"), ("node7:x", "'x'"), ("", "cs_ip is empty")])
def test_a_bad_address_is_a_one_line_error_naming_it(cs_ip: str, named: str) -> None:
    with pytest.raises((AddressError, InitializeError)) as exc:
        cbtorch.initialize(cs_ip)
    assert named in str(exc.value) and "\n" not in str(exc.value)
