"""The same float32 training on the CPU, the embedded emulator and a remote emulator agrees."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch

from csrun.emulator.remote.server import EmulatorServer

from .helpers import max_rel, settings, train

pytestmark = pytest.mark.timeout(60)

TOKEN = "device-test-token"


def assert_same(cpu, dev, tol: float = 1e-6) -> None:
    assert len(cpu.losses) == len(dev.losses) == 20
    assert max_rel(torch.tensor(dev.losses), torch.tensor(cpu.losses)) <= tol
    assert set(cpu.state["model"]) == set(dev.state["model"])
    for name, want in cpu.state["model"].items():
        assert max_rel(dev.state["model"][name], want) <= tol, name
    assert cpu.global_step == dev.global_step == 20 == dev.state["global_step"] == cpu.state["global_step"]


def test_sgd_momentum_with_warmup_and_clipping_cpu_equals_embedded(model_dir: str) -> None:
    s = settings(max_gradient_norm=0.5)
    cpu = train(None, steps=20, model_dir=model_dir, compile_settings=s)
    dev = train("embedded", steps=20, model_dir=model_dir, compile_settings=s)
    assert_same(cpu, dev)
    assert cpu.losses[-1] < cpu.losses[0]  # it trained: equality is not trivial
    # the warmup schedule drove the CPU optimizer too: 0 at step 0, 0.2 from step 10 on
    assert cpu.state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.2)
    momentum = [v["momentum_buffer"] for v in cpu.state["optimizer"]["state"].values()]
    dev_momentum = [v["momentum_buffer"] for v in dev.state["optimizer"]["state"].values()]
    assert all(max_rel(d, c) <= 1e-5 for c, d in zip(momentum, dev_momentum))


def test_adamw_with_value_clipping_cpu_equals_embedded(model_dir: str) -> None:
    s = settings(learning_rate=0.01, max_gradient_value=0.05)

    def adamw(params):
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)

    cpu = train(None, steps=20, model_dir=model_dir, compile_settings=s, make_opt=adamw)
    dev = train("embedded", steps=20, model_dir=model_dir, compile_settings=s, make_opt=adamw)
    assert_same(cpu, dev)


@pytest.fixture()
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatorServer]:
    monkeypatch.setenv("CSRUN_EMULATOR_TOKEN", TOKEN)
    srv = EmulatorServer(token=TOKEN, port=0)
    srv.start()
    yield srv
    srv.shutdown()


def test_remote_device_gives_the_same_numbers(server: EmulatorServer, model_dir: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    embedded = train("embedded", steps=20, model_dir=model_dir)
    monkeypatch.setenv("CS_IP", f"127.0.0.1:{server.address[1]}")  # the path table: CS_IP -> remote
    remote = train(None, steps=20, model_dir=model_dir)
    assert remote.losses == embedded.losses
    for name, want in embedded.state["model"].items():
        assert torch.equal(remote.state["model"][name], want), name
    assert remote.global_step == 20
