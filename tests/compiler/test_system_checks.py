"""Graph-free checks: optimizer, schedulers, lazy state, precision, data, mode, flags, params."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from csrun.compiler import (
    CompileSettings, check_batch, check_compile_flags, optimizer_spec_from_params, optimizer_spec_from_torch,
    settings_from_params, validate_only,
)
from csrun.compiler.errors import (
    ConfigError, ConflictingCompileFlags, GradAccumNotSupported, LazyOptimizerState, LRSchedulerNotSupported,
    ShapeChanged, ShortLastBatch, TrainAndEvalNotSupported, UnsupportedOptimizer, WeightsNotFloat32,
)
from csrun.compiler.spec import LossScalingSpec, OptimizerSpec, ProgramSpec

from tests.tiny_models import DeepMLP

from .helpers import SETTINGS, here, line_of, same_file


def _only(result, cls):  # noqa: ANN001, ANN202
    assert [type(p) for p in result.problems] == [cls], [p.render() for p in result.problems]
    return result.problems[0]


def test_unsupported_torch_optimizer_named_at_the_call() -> None:
    m = DeepMLP()
    opt = torch.optim.LBFGS(m.parameters())
    r, line = validate_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=opt), here()
    p = _only(r, UnsupportedOptimizer)
    assert same_file(p.filename, __file__) and p.lineno == line
    assert "LBFGS" in p.render() and "sgd, adam, adamw" in p.render()


class Shampoo(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 0.1) -> None:  # noqa: ANN001
        super().__init__(params, {"lr": lr})
        for g in self.param_groups:
            for p in g["params"]:
                self.state[p]["precond"] = torch.zeros_like(p)

    @torch.no_grad()
    def step(self) -> None:  # noqa: D102
        for g in self.param_groups:
            for p in g["params"]:
                p.add_(p.grad, alpha=-g["lr"])


def test_unsupported_custom_optimizer_named_at_its_class() -> None:
    m = DeepMLP()
    r = validate_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=Shampoo(m.parameters()))
    p = _only(r, UnsupportedOptimizer)
    assert same_file(p.filename, __file__) and p.lineno == line_of(Shampoo, "class Shampoo")


class Lamb(torch.optim.Optimizer):
    """Seed 002's example: momentum created on the first step."""

    def __init__(self, params, lr: float = 0.1) -> None:  # noqa: ANN001
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self) -> None:  # noqa: D102
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if len(state) == 0:
                    state["momentum"] = torch.zeros_like(p.grad)  # LAZY
                state["momentum"].add_(p.grad * 0.001)
                p.add_(state["momentum"], alpha=-group["lr"])


class PreinitLamb(Lamb):
    def __init__(self, params, lr: float = 0.1) -> None:  # noqa: ANN001
        super().__init__(params, lr)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["momentum"] = torch.zeros_like(p)


def test_lazy_optimizer_state_named_at_the_line_that_creates_it() -> None:
    m = DeepMLP()
    before = [p.detach().clone() for p in m.parameters()]
    opt = Lamb(m.parameters())
    r = validate_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=opt)
    p = _only(r, LazyOptimizerState)
    assert same_file(p.filename, __file__) and p.lineno == line_of(Lamb.step, "# LAZY")
    assert "__init__" in p.render() and "momentum" in p.render()
    assert len(opt.state) == 0  # the user's optimizer was not touched
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))


def test_preinitialized_custom_optimizer_passes() -> None:
    m = DeepMLP()
    r = validate_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=PreinitLamb(m.parameters()))
    assert r.ok, [p.render() for p in r.problems]
    assert r.spec.optimizer.type == "lamb"


def test_lr_scheduler_attached_or_passed() -> None:
    m = DeepMLP()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
    r, line = validate_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=opt), here()
    p = _only(r, LRSchedulerNotSupported)
    assert same_file(p.filename, __file__) and p.lineno == line
    assert "global step" in p.render()
    r2 = validate_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=opt, lr_schedulers=[sched])
    assert not any(isinstance(q, LRSchedulerNotSupported) for q in r2.problems)  # handed over: the device runs it
    lam = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    r3 = validate_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=opt, lr_schedulers=[sched, lam])
    assert "LambdaLR" in _only(r3, LRSchedulerNotSupported).render()


def test_grad_accum_and_train_and_eval_refused_together() -> None:
    settings = CompileSettings(mode="train_and_eval", grad_accum_steps=4, learning_rate=0.1)
    r, line = validate_only(DeepMLP(), DeepMLP.batch(), settings=settings), here()
    kinds = [type(p) for p in r.problems]
    assert kinds == [TrainAndEvalNotSupported, GradAccumNotSupported]
    assert all(same_file(p.filename, __file__) and p.lineno == line for p in r.problems)
    assert "Training with Eval on CS is not currently supported." in r.problems[0].render()
    assert "Gradient Accumulation not supported on CS workflow." in r.problems[1].render()
    assert "batch_size" in r.problems[1].fix


def test_half_weights_refused_under_mixed_precision() -> None:
    m = DeepMLP().half()
    b = {k: (v.half() if v.is_floating_point() else v) for k, v in DeepMLP.batch().items()}
    r, line = validate_only(m, b, settings=SETTINGS), here()
    p = _only(r, WeightsNotFloat32)
    assert same_file(p.filename, __file__) and p.lineno == line
    assert "body.0.weight (float16)" in p.render() and "model.float()" in p.render()


def test_short_last_batch_refused() -> None:
    ds = TensorDataset(torch.randn(10, 16), torch.randint(0, 4, (10,)))
    dl = DataLoader(ds, batch_size=4, drop_last=False)
    r, line = validate_only(DeepMLP(), DeepMLP.batch(4), settings=SETTINGS, dataloader=dl), here()
    p = _only(r, ShortLastBatch)
    assert same_file(p.filename, __file__) and p.lineno == line
    assert "drop_last must be set to True" in p.render() and "last batch of 2" in p.render()
    ok = validate_only(DeepMLP(), DeepMLP.batch(4), settings=SETTINGS, dataloader=DataLoader(ds, batch_size=4, drop_last=True))
    assert ok.ok


def test_changed_batch_shape_refused() -> None:
    r = validate_only(DeepMLP(), DeepMLP.batch(8), settings=SETTINGS)
    check_batch(DeepMLP.batch(8), r.spec)
    with pytest.raises(ShapeChanged) as info:
        line = here(); check_batch(DeepMLP.batch(5), r.spec)  # noqa: E702
    assert same_file(info.value.filename, __file__) and info.value.lineno == line
    assert "float32[8, 16], got float32[5, 16]" in str(info.value) and "drop_last=True" in str(info.value)
    with pytest.raises(ShapeChanged):
        check_batch({"x": torch.randn(8, 16)}, r.spec)


def test_several_check_problems_together_with_capture_problems() -> None:
    class Bad(DeepMLP):
        def forward(self, batch):  # noqa: ANN001, ANN202
            loss = super().forward(batch)
            print(loss)  # BAD-PRINT
            return loss

    m = Bad()
    r = validate_only(m, DeepMLP.batch(), settings=CompileSettings(grad_accum_steps=2),
                      optimizer=torch.optim.LBFGS(m.parameters()))
    kinds = [type(p).__name__ for p in r.problems]
    assert kinds == ["GradAccumNotSupported", "UnsupportedOptimizer", "TensorToScalar"]
    assert r.problems[-1].lineno == line_of(Bad.forward, "# BAD-PRINT")


def test_compile_flags() -> None:
    check_compile_flags(compile_only=True, validate_only=False)
    with pytest.raises(ConflictingCompileFlags, match="^Please set one of compile_only and validate_only$"):
        check_compile_flags(compile_only=True, validate_only=True)


def test_optimizer_spec_from_torch_groups() -> None:
    m = DeepMLP()
    decay = [p for n, p in m.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in m.named_parameters() if n.endswith("bias")]
    opt = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-4, weight_decay=0.01)
    spec = optimizer_spec_from_torch(opt, model=m)
    assert spec.type == "adamw" and spec.hyperparameters["betas"] == [0.9, 0.999]
    assert spec.hyperparameters["weight_decay"] == 0.01 and "lr" not in spec.hyperparameters
    assert spec.param_groups[1] == {"params": ["body.0.bias", "body.2.bias", "head.bias"], "weight_decay": 0.0}
    assert optimizer_spec_from_torch(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)).hyperparameters["momentum"] == 0.9


def test_settings_from_legacy_params() -> None:
    params = {
        "model": {"mixed_precision": True},
        "csconfig": {"use_cbfloat16": True},
        "optimizer": {"optimizer_type": "AdamW", "weight_decay_rate": 0.01, "beta1": 0.9, "beta2": 0.98,
                      "correct_bias": True, "exclude_from_weight_decay": ["LayerNorm", "bias"],
                      "learning_rate": [{"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1e-4,
                                         "steps": 10000}, {"scheduler": "Linear", "initial_learning_rate": 1e-4,
                                                           "end_learning_rate": 0.0, "steps": 1000000}],
                      "loss_scaling_factor": "dynamic", "max_gradient_norm": 1.0},
    }
    s = settings_from_params(params, mode="train")
    assert s.precision == "cbfloat16" and s.optimizer.type == "adamw"
    assert s.optimizer.hyperparameters == {"weight_decay": 0.01, "betas": [0.9, 0.98], "correct_bias": True,
                                           "exclude_from_weight_decay": ["LayerNorm", "bias"],
                                           "eps": 1e-8}  # the type's own keys always: its default eps is written
    assert s.loss_scaling.factor == "dynamic" and s.max_gradient_norm == 1.0
    assert s.learning_rate[0]["scheduler"] == "Linear"
    with pytest.raises(UnsupportedOptimizer, match="lbfgs"):
        optimizer_spec_from_params({"optimizer_type": "lbfgs"})
    with pytest.raises(ConfigError, match="momentun"):
        optimizer_spec_from_params({"optimizer_type": "sgd", "momentun": 0.9})
    with pytest.raises(ConfigError, match="mixed_precision"):
        settings_from_params({"optimizer": {"optimizer_type": "sgd"}})
    with pytest.raises(ConfigError, match="learning_rate"):  # required, as in run.py's params
        optimizer_spec_from_params({"optimizer_type": "sgd"})
    accum = settings_from_params({"model": {"mixed_precision": False},
                                  "optimizer": {"optimizer_type": "sgd", "learning_rate": 0.1, "grad_accum_steps": 2}})
    assert accum.grad_accum_steps == 2 and accum.precision == "float32"


def test_spec_json_round_trip_with_new_fields() -> None:
    spec = ProgramSpec(optimizer=OptimizerSpec(type="adamw", hyperparameters={"betas": [0.9, 0.99]},
                                               param_groups=({"params": ["a"], "weight_decay": 0.0},)),
                       outputs=("loss", "logits"), loss_scaling=LossScalingSpec(factor="dynamic"), learning_rate=[{"scheduler": "Constant"}])
    assert ProgramSpec.from_json(spec.to_json()) == spec
