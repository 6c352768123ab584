"""get_state / set_state / global_step: a resumed run equals an uninterrupted one, on both paths."""

from __future__ import annotations

import pytest
import torch

import csrun.torch as cbtorch
from csrun.driver.legacy_state import StateError

from .helpers import train

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("cs_ip", [None, "embedded"])
def test_ten_plus_ten_steps_resumed_equal_twenty(model_dir: str, cs_ip) -> None:
    whole = train(cs_ip, steps=20, model_dir=model_dir)
    first = train(cs_ip, steps=10, model_dir=model_dir)
    saved = first.state
    assert set(saved) == {"model", "optimizer", "amp", "global_step"} and saved["global_step"] == 10
    assert (saved["amp"] == {}) == (cs_ip is None)
    # a new process state: other initial weights (seed), then the saved state and the data from batch 10
    second = train(cs_ip, steps=10, model_dir=model_dir, start=saved, skip=10, seed=7)
    assert second.global_step == 20 == second.state["global_step"]
    assert second.losses == pytest.approx(whole.losses[10:], rel=1e-6)
    for name, want in whole.state["model"].items():
        assert torch.allclose(second.state["model"][name], want, rtol=1e-6, atol=1e-7), name
    for i, want in whole.state["optimizer"]["state"].items():
        assert torch.allclose(second.state["optimizer"]["state"][i]["momentum_buffer"], want["momentum_buffer"],
                              rtol=1e-5, atol=1e-7)


def test_states_move_between_cpu_and_device(model_dir: str) -> None:
    cpu = train(None, steps=5, model_dir=model_dir)
    dev = train("embedded", steps=5, model_dir=model_dir, start=cpu.state, skip=5, seed=3)
    back = train(None, steps=5, model_dir=model_dir, start=dev.state, skip=10, seed=4)
    whole = train(None, steps=15, model_dir=model_dir)
    assert back.global_step == 15
    for name, want in whole.state["model"].items():
        assert torch.allclose(back.state["model"][name], want, rtol=1e-5, atol=1e-6), name


def test_set_state_refuses_a_state_that_does_not_fit(model_dir: str) -> None:
    run = train("embedded", steps=2, model_dir=model_dir)
    bad = dict(run.state, model={**run.state["model"], "extra.weight": torch.zeros(1)})
    with pytest.raises(StateError, match=r"unexpected keys \['extra.weight'\]"):
        cbtorch.set_state(bad)
    with pytest.raises(StateError, match="set_state needs the dict get_state"):
        cbtorch.set_state({"weights": 1})


def test_get_state_in_a_step_closure_is_the_state_after_that_step(model_dir: str) -> None:
    """The device hands a step's outputs out before its update; a closure's get_state still sees
    the state after its own step, not before it and not after a later one."""
    seen: dict[int, dict] = {}

    def each_step(n: int, loss: object) -> None:
        cbtorch.add_step_closure(lambda step: seen.__setitem__(step, cbtorch.get_state()), args=(n + 1,))

    train("embedded", steps=6, model_dir=model_dir, each_step=each_step)
    assert sorted(seen) == list(range(1, 7))
    assert [seen[k]["global_step"] for k in range(1, 7)] == list(range(1, 7))
    for k in (3, 6):
        alone = train("embedded", steps=k, model_dir=model_dir)
        for name, want in alone.state["model"].items():
            assert torch.equal(seen[k]["model"][name], want), (k, name)
