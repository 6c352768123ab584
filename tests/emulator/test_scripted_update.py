"""The engine's scripted update (one TorchScript call after the backward: the float16 rounding of
the gradients, the unscaling and the SGD update) gives the general path's numbers bit for bit,
is what runs where it applies, and steps aside (changing nothing) where it does not."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from csrun.emulator.engine.executor import Engine
from csrun.emulator.engine.lean_step import ScriptedUpdate, scripted_update
from tests.emulator.helpers import make_engine
from tests.tiny_models import MLP, SharedWeightMLP, mlp_batches


def _half_mlps(monkeypatch: pytest.MonkeyPatch, batches: int, engines: int) -> tuple[list[Any], list[Engine]]:
    """``batches`` batches and ``engines`` engines of one MLP: float16 by rounding, SGD with momentum."""
    monkeypatch.setenv("CSRUN_HALF_EMULATION", "rounding")
    data = mlp_batches(batches)
    torch.manual_seed(0)
    model = MLP()
    return data, [make_engine(model, data[0], "float16", {"momentum": 0.9}) for _ in range(engines)]


def _counting(engine: Engine) -> list[bool]:
    """Wrap the engine's scripted update; the list gets each call's answer."""
    update = engine._scripted_update
    assert update is not None, "the scripted update should apply to this engine"
    answers: list[bool] = []

    def counted(inv_scale: float) -> bool:
        answers.append(update(inv_scale))
        return answers[-1]

    engine._scripted_update = counted  # type: ignore[assignment]
    return answers


def _state(engine: Engine) -> list[torch.Tensor]:
    st = engine.state_dict()
    tensors = list(st["params"].values())
    for per_param in st["optimizer"]["state"].values():
        tensors += [t for t in per_param.values() if isinstance(t, torch.Tensor)]
    return tensors


@pytest.mark.parametrize("precision", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("hp", [{}, {"momentum": 0.9}, {"momentum": 0.9, "nesterov": True},
                                {"momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}])
@pytest.mark.parametrize("scale", [1.0, 128.0])
def test_scripted_update_equals_the_general_path_bit_for_bit(precision: str, hp: dict[str, Any], scale: float,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CSRUN_HALF_EMULATION", "rounding")
    batches = mlp_batches(6)
    torch.manual_seed(0)
    model = MLP()
    scripted = make_engine(model, batches[0], precision, hp, scale)
    general = make_engine(model, batches[0], precision, hp, scale)
    general._scripted_update = None
    answers = _counting(scripted)
    for b in batches:
        a, g = scripted.run_step(b), general.run_step(b)
        assert torch.equal(a["loss"], g["loss"])
    assert answers == [True] * len(batches)
    assert all(torch.equal(x, y) for x, y in zip(_state(scripted), _state(general)))
    assert all(p.grad is None for p in scripted.params)
    if scripted.half_weights is not None:
        assert all(leaf.grad is None for leaf in scripted.half_weights.leaves)


def test_weights_not_all_rounded_take_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CSRUN_HALF_EMULATION", "rounding")
    batches = mlp_batches(3)
    torch.manual_seed(0)
    engine = make_engine(SharedWeightMLP(), batches[0], "float16", {"momentum": 0.9})
    assert engine.half_weights is not None and len(engine.half_weights.masters) < len(engine.params)
    assert engine._scripted_update is None
    for b in batches:
        assert torch.isfinite(engine.run_step(b)["loss"])


def test_a_gradient_already_on_a_weight_steps_aside_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A master that holds a gradient of its own when the update comes (what a float32 op reading
    the weight too would leave): the scripted update declines before changing anything, and the
    general path adds the two gradients."""
    batches, (engine, reference) = _half_mlps(monkeypatch, 3, 2)
    reference._scripted_update = None
    update = engine._scripted_update
    assert update is not None
    answers: list[bool] = []
    before: list[list[torch.Tensor]] = []

    def with_a_gradient(inv_scale: float) -> bool:
        engine.params[0].grad = torch.zeros_like(engine.params[0])
        before.append(_state(engine))
        answers.append(update(inv_scale))
        assert all(torch.equal(x, y) for x, y in zip(before[-1], _state(engine)))  # nothing changed
        return answers[-1]

    engine._scripted_update = with_a_gradient  # type: ignore[assignment]
    for b in batches:
        assert torch.equal(engine.run_step(b)["loss"], reference.run_step(b)["loss"])
    assert answers == [False] * len(batches)
    assert all(torch.equal(x, y) for x, y in zip(_state(engine), _state(reference)))


def test_a_step_hook_takes_the_general_path_and_runs() -> None:
    batches = mlp_batches(2)
    engine = make_engine(MLP(), batches[0], "float32", {"momentum": 0.9})
    answers = _counting(engine)
    assert engine.optimizer is not None
    seen: list[int] = []
    handle = engine.optimizer.register_step_post_hook(lambda *_a: seen.append(1))
    try:
        for b in batches:
            engine.run_step(b)
    finally:
        handle.remove()
    assert answers == [False, False] and seen == [1, 1]


@pytest.mark.parametrize("spec_kw", [{"max_gradient_norm": 1.0}, {"max_gradient_value": 0.1}])
def test_clipping_and_dynamic_scaling_do_not_use_it(spec_kw: dict[str, Any]) -> None:
    batches = mlp_batches(2)
    for engine in (make_engine(MLP(), batches[0], "float32", {"momentum": 0.9}, **spec_kw),
                   make_engine(MLP(), batches[0], "float32", {"momentum": 0.9}, scale="dynamic")):
        answers = _counting(engine)
        for b in batches:
            engine.run_step(b)
        assert answers == []


def test_only_one_group_sgd_over_the_engine_weights_gets_one() -> None:
    model = MLP()
    params = list(model.parameters())
    assert isinstance(scripted_update(torch.optim.SGD(params, lr=0.1, foreach=True), params, None), ScriptedUpdate)
    assert scripted_update(torch.optim.AdamW(params, lr=0.1), params, None) is None
    assert scripted_update(None, params, None) is None
    two_groups = torch.optim.SGD([{"params": params[:2]}, {"params": params[2:]}], lr=0.1, foreach=True)
    assert scripted_update(two_groups, params, None) is None
    assert scripted_update(torch.optim.SGD(params[::-1], lr=0.1, foreach=True), params, None) is None


def test_a_state_loaded_between_steps_reaches_the_next_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """A state loaded between scripted updates: the next forward reads the loaded weights, rounded
    (as an engine built fresh and loaded does), and training goes on from the loaded state."""
    batches, (engine, donor, fresh) = _half_mlps(monkeypatch, 5, 3)
    for b in batches[:2]:
        engine.run_step(b)
    for b in batches[2:5]:
        donor.run_step(b)
    state = donor.state_dict()
    engine.load_state_dict(state)
    fresh.load_state_dict(state)
    assert torch.equal(engine.run_step(batches[0])["loss"], fresh.run_step(batches[0])["loss"])
    assert all(torch.equal(x, y) for x, y in zip(_state(engine), _state(fresh)))
