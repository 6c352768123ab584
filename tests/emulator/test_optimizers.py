"""The legacy optimizer list: each matches its eager torch counterpart; legacy keys map; LAMB by hand."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from csrun.compiler.spec import OptimizerSpec
from csrun.emulator.engine.executor import Engine
from csrun.program.errors import SpecError
from csrun.program.optimizer_classes import OPTIMIZERS, build_optimizer

from tests.tiny_models import MLP, mlp_batches
from .helpers import adamw_no_bias_correction_per_tensor, make_program, make_spec, quiet

HP = {"sgd": {"momentum": 0.9, "weight_decay_rate": 0.01}, "rmsprop": {"momentum": 0.5}, "asgd": {"weight_decay": 0.01},
      "adamw": {"correct_bias": True}, "lamb": {"weight_decay_rate": 0.01}}


_SHARED: dict[str, object] = {}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_matches_eager_and_state_exists_before_step_one(name: str) -> None:
    if not _SHARED:  # one export serves every optimizer: the engine copies the weights
        torch.manual_seed(0)
        _SHARED["model"] = MLP()
        _SHARED["batches"] = mlp_batches(4)
        _SHARED["ep"] = make_program(_SHARED["model"], _SHARED["batches"][0])[0]  # type: ignore[index]
    model: Any = _SHARED["model"]
    batches: Any = _SHARED["batches"]
    ep: Any = _SHARED["ep"]
    hp = HP.get(name, {})
    spec = make_spec(optimizer=OptimizerSpec(type=name.upper(), hyperparameters=hp), learning_rate=0.01)
    eng = Engine(ep, spec, notice=quiet)
    state0 = eng.state_dict()["optimizer"]["state"]
    assert len(state0) == len(list(model.parameters()))  # created eagerly, before the first step
    ref = copy.deepcopy(model)
    opt = build_optimizer(name, hp, list(ref.named_parameters()), lr=0.01)
    for b in batches:
        got = eng.run_step(b)["loss"]
        loss = ref(b)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert torch.equal(got, loss.detach())
    params = eng.state_dict()["params"]
    for n, p in ref.named_parameters():
        assert torch.equal(params[n], p.detach()), n


def test_legacy_keys_map_to_torch() -> None:
    params = list(MLP().named_parameters())
    adam = build_optimizer("Adam", {"beta1": 0.8, "beta2": 0.95, "weight_decay_rate": 0.1}, params, lr=1e-3)
    assert adam.defaults["betas"] == (0.8, 0.95) and adam.defaults["weight_decay"] == 0.1
    sgd = build_optimizer("sgd", {"momentum": 0.9, "use_nesterov": True}, params, lr=1e-3)
    assert sgd.defaults["nesterov"] is True
    rprop = build_optimizer("rprop", {"eta1": 0.4, "eta2": 1.1, "step_size_min": 1e-5}, params, lr=1e-3)
    assert rprop.defaults["etas"] == (0.4, 1.1) and rprop.defaults["step_sizes"] == (1e-5, 50.0)
    ada = build_optimizer("adafactor", {"eps1": None, "eps2": 1e-3, "decay_rate": -0.7}, params, lr=1e-2)
    assert isinstance(ada, torch.optim.Adafactor) and ada.defaults["beta2_decay"] == -0.7
    grouped = build_optimizer("adamw", {"weight_decay": 0.01, "exclude_from_weight_decay": ["bias"]}, params, lr=1e-3)
    assert [g["weight_decay"] for g in grouped.param_groups] == [0.01, 0.0]
    assert len(grouped.param_groups[1]["params"]) == 2


@pytest.mark.parametrize("name,hp,needle", [
    ("adamm", {}, "valid choices: sgd, adam"),
    ("sgd", {"momentun": 0.9}, "momentun"),
    ("adam", {"correct_bias": False}, "adamw only"),
    ("adafactor", {"relative_step": True}, "relative_step"),
])
def test_bad_optimizer_settings(name: str, hp: dict, needle: str) -> None:
    with pytest.raises(SpecError, match="optimizer") as info:
        build_optimizer(name, hp, list(MLP().named_parameters()), lr=0.1)
    assert needle in str(info.value)


def test_lamb_one_step_by_hand() -> None:
    p = torch.nn.Parameter(torch.tensor([3.0, 4.0]))  # ||p|| = 5
    opt = build_optimizer("lamb", {"beta1": 0.9, "beta2": 0.999, "eps": 0.0}, [("p", p)], lr=0.1)
    p.grad = torch.tensor([1.0, -2.0])
    opt.step()
    # m = 0.1 g, v = 0.001 g^2 -> u = m / sqrt(v) = (0.1 / sqrt(0.001)) * sign(g) = 3.16227766 * [1, -1]
    u = 0.1 / 0.001**0.5
    ratio = 5.0 / (u * 2**0.5)  # ||p|| / ||u||
    expected = torch.tensor([3.0 - 0.1 * ratio * u, 4.0 + 0.1 * ratio * u])
    assert torch.allclose(p.detach(), expected, rtol=1e-6)


def test_adamw_without_bias_correction_by_hand() -> None:
    p = torch.nn.Parameter(torch.tensor([1.0]))
    opt = build_optimizer("adamw", {"correct_bias": False, "eps": 0.0, "weight_decay": 0.5}, [("p", p)], lr=0.1)
    p.grad = torch.tensor([2.0])
    opt.step()
    # m = 0.2, v = 0.004 -> step = 0.1 * 0.2 / sqrt(0.004) = 0.316227766; then p *= 1 - 0.1 * 0.5
    assert p.item() == pytest.approx((1.0 - 0.1 * 0.2 / 0.004**0.5) * 0.95, rel=1e-6)


def test_adamw_without_bias_correction_foreach_step_equals_the_per_tensor_formula() -> None:
    torch.manual_seed(0)
    named = [(f"w{i}", torch.nn.Parameter(torch.randn(7, 5 + i))) for i in range(4)] + [("b", torch.nn.Parameter(torch.randn(3)))]
    ref = [torch.nn.Parameter(p.detach().clone()) for _, p in named]
    opt = build_optimizer("adamw", {"correct_bias": False, "weight_decay": 0.1, "exclude_from_weight_decay": ["b"]},
                          named, lr=1e-2)
    ref_state: dict[int, list[torch.Tensor]] = {}
    del opt.state[named[1][1]]  # a loaded state without this parameter's moments
    g = torch.Generator().manual_seed(1)
    for step in range(5):
        for i, ((_, p), r) in enumerate(zip(named, ref)):
            grad = None if (step == 2 and i == 0) else torch.randn(p.shape, generator=g)
            p.grad = grad
            r.grad = None if grad is None else grad.clone()
        opt.step()
        eps = opt.param_groups[0]["eps"]
        adamw_no_bias_correction_per_tensor(ref[:4], ref_state, 1e-2, 0.1, eps, opt.param_groups[0]["betas"])
        adamw_no_bias_correction_per_tensor(ref[4:], ref_state, 1e-2, 0.0, eps, opt.param_groups[0]["betas"])
    assert all(torch.equal(p.detach(), r.detach()) for (_, p), r in zip(named, ref))
    for (_, p), r in zip(named, ref):
        assert torch.equal(opt.state[p]["exp_avg"], ref_state[id(r)][0])
        assert torch.equal(opt.state[p]["exp_avg_sq"], ref_state[id(r)][1])


FOREACH_VARIANTS = [
    ("sgd", {}), ("sgd", {"momentum": 0.9, "weight_decay": 0.01}), ("sgd", {"momentum": 0.9, "nesterov": True}),
    ("adam", {}), ("adam", {"weight_decay": 0.01, "amsgrad": True}), ("adamw", {"weight_decay": 0.1}),
    ("adamw", {"amsgrad": True}), ("adamax", {"weight_decay": 0.01}), ("adadelta", {}), ("adagrad", {"lr_decay": 0.01}),
    ("rmsprop", {"momentum": 0.9, "centered": True}), ("rprop", {}),
]


@pytest.mark.parametrize("name,hp", FOREACH_VARIANTS, ids=[f"{n}-{'-'.join(h) or 'default'}" for n, h in FOREACH_VARIANTS])
def test_foreach_updates_equal_eager_per_tensor_ones(name: str, hp: dict) -> None:
    from csrun.program.optimizer_classes import FOREACH_EXACT

    assert name in FOREACH_EXACT
    torch.manual_seed(0)
    model, batches = MLP(), mlp_batches(5)
    trained = []
    for foreach in (None, False):  # the device's default (foreach) and what eager CPU torch runs
        ref = copy.deepcopy(model)
        opt = build_optimizer(name, dict(hp) if foreach is None else {**hp, "foreach": False},
                              list(ref.named_parameters()), lr=0.01)
        assert opt.defaults["foreach"] is (True if foreach is None else False)
        for b in batches:
            loss = ref(b)
            opt.zero_grad()
            loss.backward()
            opt.step()
        trained.append([p.detach() for p in ref.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*trained))
