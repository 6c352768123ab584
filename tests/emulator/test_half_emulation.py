"""float16 / bfloat16 emulated on float32 kernels (CSRUN_HALF_EMULATION=rounding) against autocast.

Stated tolerance, every op of the BERT and GPT-2 debug models (forward, same weights and
batch): ``max |emulated - autocast| <= 2**-9 * max |autocast|`` per op output, i.e. within two
half-units in the last place of float16 at the tensor's largest value (the two differ in
summation order only). Training: the loss-scale sequence is identical and losses agree to
1e-2 relative; float16's range (forward overflow to inf, gradient overflow under loss
scaling) behaves as under autocast.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch.fx import GraphModule, Interpreter
from torch.utils import _pytree as pytree

from csrun.compiler.spec import LossScalingSpec, OptimizerSpec
from csrun.emulator.engine import half_emulation
from csrun.emulator.engine.executor import Engine, drop_metadata_asserts
from csrun.errors import ConfigError

from tests.tiny_models import MLP, DropoutConvNet, SharedWeightMLP, TinyTransformer, conv_batches, lm_batches, mlp_batches
from ..models.helpers import first_batch, load_module, load_params
from .helpers import make_program, quiet

TOLERANCE = 2.0**-9


class _Record(Interpreter):
    """Runs a graph and keeps every tensor a node produces, by node name."""

    def __init__(self, module: GraphModule) -> None:
        super().__init__(module)
        self.values: dict[str, torch.Tensor] = {}

    def run_node(self, n: Any) -> Any:  # noqa: D102
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            self.values[n.name] = result.detach()
        return result


def _debug_model(name: str) -> tuple[torch.nn.Module, Any]:
    from csrun.data import hdf5_dataloader

    model_mod, data_mod = load_module(name, "model"), load_module(name, "data")
    if name == "bert":
        params = load_params("bert_debug", model_mod.BertConfig, data_mod.BertInputConfig)
        make = model_mod.BertPretrainModel
    else:
        params = load_params("gpt2_debug", model_mod.Gpt2Config, data_mod.GptInputConfig)
        make = model_mod.Gpt2LMHeadModel
    batch = first_batch(hdf5_dataloader(data_mod.resolved(params.train_input), vocab_size=params.model.vocab_size))
    torch.manual_seed(0)
    model = make(dataclasses.replace(params.model, dropout=0.0) if hasattr(params.model, "dropout") else params.model)
    return model.eval(), batch


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_every_op_of_the_debug_models_matches_autocast(name: str) -> None:
    model, batch = _debug_model(name)
    program = torch.export.export(model, (batch,))
    reference, emulated = program.module(), program.module()
    drop_metadata_asserts(reference)
    drop_metadata_asserts(emulated)
    weights = half_emulation.apply_half_emulation(emulated, torch.float16)
    weights.refresh()
    inputs = pytree.tree_leaves((batch,))
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.float16):
            want = _Record(reference)
            want.run(*inputs)
        got = _Record(emulated)
        got.run(*inputs)
    compared, low = 0, 0
    for node, ref in want.values.items():
        if not ref.is_floating_point() or node not in got.values:
            continue
        value = got.values[node].float()
        if ref.dtype == torch.float16:
            value = value.half().float()  # a 16-bit op's value is its rounding (the next node in the rewrite)
            low += 1
        assert value.shape == ref.shape, node
        scale = ref.float().abs().max().item()
        diff = (value - ref.float()).abs().max().item()
        assert diff <= TOLERANCE * scale + 1e-30, f"{name} op {node}: {diff:.3g} off at scale {scale:.3g}"
        compared += 1
    assert compared > 50 and low > 20, (compared, low)  # the whole model was compared, 16-bit ops included


def _engine(model: torch.nn.Module, batch: Any, mode: str, monkeypatch: pytest.MonkeyPatch,
            precision: str = "float16", **spec: Any) -> Engine:
    monkeypatch.setenv(half_emulation.ENV, mode)
    torch.manual_seed(0)
    program, program_spec = make_program(model, batch, precision=precision, **spec)
    return Engine(program, program_spec, notice=quiet)


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_training_follows_autocast(precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(1)
    model, batches = TinyTransformer(), lm_batches(12)
    spec = dict(optimizer=OptimizerSpec(type="adamw", hyperparameters={}), learning_rate=1e-2,
                loss_scaling=LossScalingSpec(factor="dynamic", initial_loss_scale=2.0**15, steps_per_increase=3))
    runs = {}
    for mode in ("autocast", "rounding"):
        e = _engine(model, batches[0], mode, monkeypatch, precision, **spec)
        assert (e.half_weights is not None) == (mode == "rounding")
        outs = [e.run_step(b) for b in batches]
        runs[mode] = ([o["loss"].item() for o in outs], [o["loss_scale"].item() for o in outs])
    (want, want_scales), (got, got_scales) = runs["autocast"], runs["rounding"]
    assert got_scales == want_scales
    assert got == pytest.approx(want, rel=1e-2)
    assert got[-1] < got[0]


def test_forward_overflow_is_inf_as_under_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = mlp_batches(1)[0]
    big = (x * 1e5, y)  # linear outputs beyond float16's 65504
    for mode in ("autocast", "rounding"):
        e = _engine(MLP(), big, mode, monkeypatch, loss_scaling=LossScalingSpec(factor="dynamic"))
        before = {k: v.clone() for k, v in e.state_dict()["params"].items()}
        out = e.run_step(big)
        assert not torch.isfinite(out["loss"]), mode
        after = e.state_dict()["params"]
        assert all(torch.equal(before[k], after[k]) for k in before), mode  # the update was skipped
    e32 = _engine(MLP(), big, "rounding", monkeypatch, precision="float32")
    assert torch.isfinite(e32.run_step(big)["loss"])  # float32 would not have overflowed


def test_gradient_overflow_under_loss_scaling_as_under_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = mlp_batches(10)
    scales = {}
    for mode in ("autocast", "rounding"):
        e = _engine(MLP(), batches[0], mode, monkeypatch,
                    loss_scaling=LossScalingSpec(factor="dynamic", initial_loss_scale=2.0**24, steps_per_increase=100))
        scales[mode] = [e.run_step(b)["loss_scale"].item() for b in batches]
    # float16 gradients overflow at 2**24 and the scale backs off; float32 gradients would not
    assert scales["autocast"][0] == 2.0**24 and scales["autocast"][-1] < 2.0**24
    assert scales["rounding"] == scales["autocast"]


def test_the_mode_is_chosen_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(half_emulation.ENV, raising=False)
    assert half_emulation.half_emulation_mode(torch.device("cpu")) == "rounding"
    assert half_emulation.half_emulation_mode(torch.device("cuda")) == "autocast"
    monkeypatch.setenv(half_emulation.ENV, "autocast")
    assert half_emulation.half_emulation_mode(torch.device("cpu")) == "autocast"
    monkeypatch.setenv(half_emulation.ENV, "sometimes")
    with pytest.raises(ConfigError, match="CSRUN_HALF_EMULATION: 'sometimes' is not one of 'rounding', 'autocast'"):
        half_emulation.half_emulation_mode(torch.device("cpu"))


def test_weights_stay_float32_masters(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = mlp_batches(3)
    e = _engine(MLP(), batches[0], "rounding", monkeypatch)
    for b in batches:
        e.run_step(b)
    params = e.state_dict()["params"]
    assert all(v.dtype == torch.float32 for v in params.values())
    assert not any(k.startswith(half_emulation.HalfWeights.PREFIX) for k in params)
    # the masters carry float32 detail a float16 copy would lose
    assert any(not torch.equal(v, v.half().float()) for v in params.values())


def test_a_weight_only_16_bit_ops_read_is_read_through_its_leaf_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rewrite leaves no read of a master that nothing uses: the traced forward takes each
    weight once (its leaf), not the master too. A weight a float32 op reads as well keeps its read."""
    batches = mlp_batches(2)
    e = _engine(MLP(), batches[0], "rounding", monkeypatch)
    reads = {str(n.target) for n in e.module.graph.nodes if n.op == "get_attr"}
    assert e.half_weights is not None and reads == {f"{half_emulation.HalfWeights.PREFIX}{i}" for i in range(4)}
    both = _engine(SharedWeightMLP(), batches[0], "rounding", monkeypatch)  # l1.weight read by a float32 op too
    reads = {str(n.target) for n in both.module.graph.nodes if n.op == "get_attr"}
    assert "l1.weight" in reads and "l2.weight" not in reads
    for b in batches:
        assert torch.isfinite(both.run_step(b)["loss"])
    assert all(p.grad is None for p in both.params)


class _Inverts(torch.nn.Module):
    """An op that refuses zeros: the inverse of a matrix made from its weight."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.eye(4) + 0.1 * torch.randn(4, 4))
        self.head = torch.nn.Linear(4, 5)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.head(x[:, :4] @ torch.linalg.inv(self.w)), y)


def _probe_module(model: torch.nn.Module, batch: Any) -> GraphModule:
    module = torch.export.export(model, (batch,)).module()
    drop_metadata_asserts(module)
    return module


def _by_name(dtypes: dict[Any, torch.dtype]) -> dict[str, torch.dtype]:
    return {n.name: d for n, d in dtypes.items()}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_probe_on_zero_tensors_answers_as_on_fake_ones_and_touches_nothing(
        dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small program's autocast probe runs on real zero tensors (half_emulation.autocast_dtypes):
    every node's dtype is the fake-tensor probe's, no weight or buffer (batch norm's running
    statistics) changes, and the random generator (dropout) is where it was."""
    zero_runs: list[bool] = []

    class Spy(half_emulation._DtypeProbe):
        def __init__(self, module: GraphModule, *, zero_state: bool = False) -> None:
            super().__init__(module, zero_state=zero_state)
            zero_runs.append(zero_state)

    monkeypatch.setattr(half_emulation, "_DtypeProbe", Spy)
    torch.manual_seed(0)
    for model, batch in ((MLP(), mlp_batches(1)[0]), (TinyTransformer(), lm_batches(1)[0]),
                         (DropoutConvNet().train(), conv_batches(1)[0])):
        module = _probe_module(model, batch)
        state = {k: v.clone() for k, v in module.state_dict().items()}
        rng = torch.random.get_rng_state()
        real = half_emulation.autocast_dtypes(module, dtype)
        assert zero_runs[-1] is True
        assert torch.equal(torch.random.get_rng_state(), rng)
        assert all(torch.equal(v, module.state_dict()[k]) for k, v in state.items())
        with monkeypatch.context() as m:
            m.setattr(half_emulation, "REAL_PROBE_MAX_ELEMENTS", -1)
            fake = half_emulation.autocast_dtypes(module, dtype)
        assert zero_runs[-1] is False
        assert _by_name(real) == _by_name(fake) and dtype in real.values()


def test_a_program_that_refuses_zeros_is_probed_on_fake_tensors() -> None:
    batch = mlp_batches(1)[0]
    module = _probe_module(_Inverts(), batch)
    with pytest.raises(RuntimeError):  # what the zero run meets
        torch.linalg.inv(torch.zeros(4, 4))
    dtypes = half_emulation.autocast_dtypes(module, torch.float16)
    assert torch.float16 in dtypes.values()
    e = Engine(*make_program(_Inverts(), batch, precision="float16"), notice=quiet)
    assert e.half_weights is not None and torch.isfinite(e.run_step(batch)["loss"])


_CUSTOM_CALLS: list[int] = []


@torch.library.custom_op("csrun_test::counted_double", mutates_args=())
def _counted_double(x: torch.Tensor) -> torch.Tensor:
    _CUSTOM_CALLS.append(1)  # what a custom op may do besides computing
    return x * 2


@_counted_double.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class _CallsCustom(torch.nn.Module):
    """A forward through a custom op that records its calls: shaped for the probe test below."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(12, 5)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(_counted_double(self.l1(x)), y)


def test_a_program_with_a_custom_op_is_probed_on_fake_tensors() -> None:
    """Only torch's own operators run for real in the probe: a custom op (user code) is not called."""
    module = _probe_module(_CallsCustom(), mlp_batches(1)[0])
    _CUSTOM_CALLS.clear()
    dtypes = half_emulation.autocast_dtypes(module, torch.float16)
    assert _CUSTOM_CALLS == [] and torch.float16 in dtypes.values()
