"""The engine's lean optimizer update equals ``optimizer.step()`` bit for bit, and steps aside
(changing nothing) wherever it does not apply."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch.optim import optimizer as torch_optimizer

from csrun.emulator.engine.lean_step import lean_step
from csrun.program.optimizer_classes import build_optimizer, preinitialize_state


def _model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4), torch.nn.Linear(4, 3))
    return model.to(dtype)


def _grads(model: torch.nn.Module, step: int, *, skip_last: bool = False) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for i, p in enumerate(model.parameters()):
        p.grad = None if skip_last and i >= 4 else (torch.randn(p.shape, generator=g) * 1e-2).to(p.dtype)


def _train(make_opt: Callable[[list[tuple[str, Any]]], torch.optim.Optimizer], lean: bool, steps: int = 5,
           *, skip_last: bool = False, dtype: torch.dtype = torch.float32) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    model = _model(dtype)
    opt = make_opt(list(model.named_parameters()))
    preinitialize_state(opt)
    run = lean_step(opt) if lean else None
    for step in range(steps):
        _grads(model, step, skip_last=skip_last)
        for g in opt.param_groups:
            g["lr"] = 0.1 / (step + 1)
        if run is None or not run():
            assert not lean, "the lean update stepped aside where it applies"
            opt.step()
        opt.zero_grad(set_to_none=True)
    state = [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    return [p.detach().clone() for p in model.parameters()], state


@pytest.mark.parametrize("hp", [
    {}, {"momentum": 0.9}, {"momentum": 0.9, "dampening": 0.1}, {"momentum": 0.9, "weight_decay": 0.01},
    {"momentum": 0.9, "nesterov": True}, {"momentum": 0.5, "exclude_from_weight_decay": ["bias"], "weight_decay": 0.1},
])
@pytest.mark.parametrize("skip_last", [False, True])
def test_lean_sgd_equals_optimizer_step_bit_for_bit(hp: dict[str, Any], skip_last: bool) -> None:
    def make(named: list[tuple[str, Any]]) -> torch.optim.Optimizer:
        return build_optimizer("sgd", dict(hp), named, lr=0.1)

    eager_params, eager_state = _train(make, lean=False, skip_last=skip_last)
    lean_params, lean_state = _train(make, lean=True, skip_last=skip_last)
    assert all(torch.equal(a, b) for a, b in zip(eager_params, lean_params))
    assert len(eager_state) == len(lean_state)
    assert all(torch.equal(a, b) for a, b in zip(eager_state, lean_state))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("hp", [{"momentum": 0.9}, {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}])
def test_lean_sgd_on_weights_not_float32_equals_optimizer_step_bit_for_bit(dtype: torch.dtype, hp: dict[str, Any]) -> None:
    """The momentum goes in as a Python scalar here (a float32 0-dim tensor would round it to the
    weights' format first for 16-bit ones)."""
    def make(named: list[tuple[str, Any]]) -> torch.optim.Optimizer:
        return build_optimizer("sgd", dict(hp), named, lr=0.1)

    eager_params, eager_state = _train(make, lean=False, dtype=dtype)
    lean_params, lean_state = _train(make, lean=True, dtype=dtype)
    assert all(p.dtype == dtype for p in lean_params)
    assert all(torch.equal(a, b) for a, b in zip(eager_params, lean_params))
    assert all(torch.equal(a, b) for a, b in zip(eager_state, lean_state))


def _sgd(**kw: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True, **kw)
    preinitialize_state(opt)
    _grads(model, 0)
    return model, opt


@pytest.mark.parametrize("case", ["maximize", "foreach off", "tensor lr", "no momentum buffer", "hook", "global hook",
                                  "sparse grad"])
def test_lean_sgd_steps_aside_and_changes_nothing(case: str) -> None:
    handles = []
    if case == "maximize":
        model, opt = _sgd(momentum=0.9, maximize=True)
    elif case == "foreach off":
        model, opt = _sgd(momentum=0.9)
        opt.param_groups[0]["foreach"] = False
    elif case == "tensor lr":
        model, opt = _sgd(momentum=0.9)
        opt.param_groups[0]["lr"] = torch.tensor(0.1)
    elif case == "no momentum buffer":
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)  # state made lazily
        _grads(model, 0)
    elif case == "hook":
        model, opt = _sgd(momentum=0.9)
        handles.append(opt.register_step_pre_hook(lambda *a: None))
    elif case == "global hook":
        model, opt = _sgd(momentum=0.9)
        handles.append(torch_optimizer.register_optimizer_step_post_hook(lambda *a: None))
    else:
        model, opt = _sgd(momentum=0.9)
        first = next(model.parameters())
        first.grad = first.grad.to_sparse()
    try:
        before = [p.detach().clone() for p in model.parameters()]
        run = lean_step(opt)
        assert run is not None
        assert run() is False
        assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    finally:
        for h in handles:
            h.remove()


def test_no_lean_form_for_other_optimizers() -> None:
    params = list(_model().parameters())

    class MySGD(torch.optim.SGD):
        pass

    assert lean_step(torch.optim.AdamW(params, lr=1e-3)) is None
    assert lean_step(MySGD(params, lr=1e-3)) is None
    assert lean_step(torch.optim.SGD(params, lr=1e-3, foreach=True)) is not None


@pytest.mark.parametrize("factor", [1e39, float("inf"), float("nan"), 3.4028234663852886e38, 1e-45])
def test_the_scaling_of_float32_gradients_matches_torch_beyond_float32s_range(factor: float) -> None:
    """The unscaling factor of a tiny static loss scale can exceed float32's range: the update then
    multiplies by the Python scalar (inf or NaN products, as torch's), not by a float32 tensor that
    torch.full refuses to make."""
    from csrun.emulator.engine.lean_step import sgd_update

    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(5, 3, generator=g) * 1e-3, torch.zeros(4)]
    params = [torch.randn(5, 3, generator=g), torch.randn(4, generator=g)]
    bufs = [torch.zeros(5, 3), torch.zeros(4)]
    want = [g.clone() for g in grads]
    torch._foreach_mul_(want, factor)
    sgd_update()([g.clone() for g in grads], params, bufs, [], [], factor, 0.0, 0.9, 0.1, 0.0, False, True)
    got = bufs  # with momentum the buffers took the unscaled gradients (times 1 - dampening = 1)
    for a, b in zip(got, want):
        assert torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan())
