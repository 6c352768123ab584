"""The path table: which backend initialize() gives the chief, from arguments and environment."""

from __future__ import annotations

import pytest

import csrun.torch as cbtorch
from csrun.torch.device_backend import DeviceBackend
from csrun.torch.paths import InitializeError, choose

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("cs_ip,env,want", [
    ("embedded", {}, (None, True)),
    (None, {"CSRUN_LAUNCHER": "csrun_wse"}, (None, True)),
    (None, {"CSRUN_LAUNCHER": "csrun_wse", "CS_IP": "node7:9100"}, ("node7:9100", False)),
    (None, {"CS_IP": "node7"}, ("node7:9000", False)),
    ("10.0.0.5:1234", {"CSRUN_LAUNCHER": "csrun_wse"}, ("10.0.0.5:1234", False)),
    (None, {"CSRUN_LAUNCHER": "csrun_cpu"}, (None, False)),
    (None, {}, (None, False)),
])
def test_choose(cs_ip, env, want) -> None:
    assert choose(cs_ip, compile_only=False, validate_only=False, env=env) == want


def test_initialize_picks_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(cbtorch.initialize().backend, cbtorch.EagerBackend) and not cbtorch.use_cs()
    monkeypatch.setenv("CSRUN_LAUNCHER", "csrun_wse")
    st = cbtorch.initialize(queue_depth=3)
    assert isinstance(st.backend, DeviceBackend) and st.options.embedded and st.options.queue_depth == 3
    assert cbtorch.use_cs() and cbtorch.global_step() == 0
    monkeypatch.setenv("CSRUN_LAUNCHER", "csrun_cpu")
    assert isinstance(cbtorch.initialize(compile_only=True).backend, DeviceBackend)
    with pytest.raises(InitializeError, match="Please set one of compile_only and validate_only"):
        cbtorch.initialize(compile_only=True, validate_only=True)
    with pytest.raises(InitializeError, match="queue_depth must be a positive integer"):
        cbtorch.initialize("embedded", queue_depth=0)
