"""The step's CUDA graph (csrun.emulator.engine.cuda_graph).

On any machine: the check that names what a graph cannot hold, and the graph's step — its body
(forward, loss scaling, backward) run as it is, the update after it — against the step without it,
bit for bit, for fc_mnist, BERT debug and GPT-2 debug, dynamic loss scaling's skipped steps,
16-bit emulation and accumulation. With a GPU (skipped elsewhere, with the reason): the capture
and its replays against the step without a graph and against eager PyTorch, and the fallback.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, cast

import pytest
import torch
from torch import nn
from torch.utils import _pytree as pytree

from csrun.compiler.spec import LossScalingSpec, OptimizerSpec
from csrun.emulator.engine import cuda_graph
from csrun.emulator.engine.cuda_graph import StepGraph, graph_blocker
from csrun.emulator.engine.executor import Engine
from csrun.errors import ConfigError
from csrun.program.step_plan import StepPlan

from tests.models.helpers import first_batch, load_module, load_params
from tests.tiny_models import MLP, mlp_batches
from .helpers import make_program, quiet

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible: the capture needs one")
SCHEDULE = {"scheduler": "Linear", "initial_learning_rate": 0.01, "end_learning_rate": 0.001, "steps": 100}
Model = Callable[[], tuple[nn.Module, list[Any], OptimizerSpec]]


# -- the models -----------------------------------------------------------------------------------

def fc_mnist(steps: int) -> tuple[nn.Module, list[Any], OptimizerSpec]:
    """models/fc_mnist's model as configs/fc_mnist.yaml has it (10 x 50, relu), ``steps`` batches of
    128 8x8 images, and its optimizer: SGD with momentum."""
    model_mod = load_module("fc_mnist", "model")
    params = load_params("fc_mnist", model_mod.FcMnistConfig, model_mod.FcMnistInputConfig)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.rand(128, 64, generator=g), torch.randint(0, 10, (128,), generator=g)) for _ in range(steps)]
    torch.manual_seed(0)
    return model_mod.FcMnist(params.model), batches, OptimizerSpec(type="sgd", hyperparameters={"momentum": 0.9})


def debug_model(name: str, steps: int) -> tuple[nn.Module, list[Any], OptimizerSpec]:
    """models/<name>'s debug config: the model, its first ``steps`` batches (repeated), AdamW."""
    from csrun.data import hdf5_dataloader

    model_mod, data_mod = load_module(name, "model"), load_module(name, "data")
    if name == "bert":
        model_cls, input_cls, model_name = model_mod.BertConfig, data_mod.BertInputConfig, "BertPretrainModel"
    else:
        model_cls, input_cls, model_name = model_mod.Gpt2Config, data_mod.GptInputConfig, "Gpt2LMHeadModel"
    params = load_params(f"{name}_debug", model_cls, input_cls)
    loader = hdf5_dataloader(data_mod.resolved(params.train_input), vocab_size=params.model.vocab_size)
    first = first_batch(loader)
    batches = [first] * steps
    torch.manual_seed(0)
    model = getattr(model_mod, model_name)(dataclasses.replace(params.model))
    return model, batches, OptimizerSpec(type="adamw", hyperparameters={"weight_decay": 0.01})


def pair(model: nn.Module, batches: list[Any], opt: OptimizerSpec, device: str = "cpu",
         **spec_kw: Any) -> tuple[Engine, Engine]:
    """(the engine with the step's graph, the one without), from the same program."""
    ep, spec = make_program(copy.deepcopy(model), batches[0], optimizer=opt, **spec_kw)
    return (Engine(ep, spec, device, notice=quiet, step_graph=True),
            Engine(ep, spec, device, notice=quiet, step_graph=False))


def run_both(graphed: Engine, plain: Engine, batches: list[Any],
             plans: list[StepPlan] | None = None) -> tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]]:
    """Every step's outputs (on the CPU) of both engines."""
    outs: tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]] = ([], [])
    for i, batch in enumerate(batches):
        plan = plans[i] if plans else StepPlan()
        for engine, got in zip((graphed, plain), outs):
            got.append({k: v.detach().cpu() for k, v in engine.run_step(batch, plan=plan).items()})
    return outs


def assert_same_bits(graphed: Engine, plain: Engine, a: list[dict[str, torch.Tensor]],
                     b: list[dict[str, torch.Tensor]]) -> None:
    """The same outputs every step, the same weights, optimizer state and scaler, bit for bit."""
    for step, (x, y) in enumerate(zip(a, b)):
        assert x.keys() == y.keys(), step
        for k in x:
            assert torch.equal(x[k], y[k]), f"step {step + 1}: {k} {x[k]} != {y[k]}"
    sa, sb = graphed.state_dict(), plain.state_dict()
    for name in sb["params"]:
        assert torch.equal(sa["params"][name], sb["params"][name]), name
    for i, state in sb["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(sa["optimizer"]["state"][i][key]), torch.as_tensor(value)), (i, key)
    assert sa["scaler"] == sb["scaler"] and sa["global_step"] == sb["global_step"]


# -- what a graph cannot hold ---------------------------------------------------------------------

class HostRead(torch.autograd.Function):
    """Identity whose backward reads a value back to the host."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return grad * float(grad.abs().max())


def test_the_check_names_host_reads_data_dependent_shapes_and_other_devices() -> None:
    x = torch.randn(8, requires_grad=True)
    here = torch.device("cpu")
    cases: list[tuple[Callable[[], Any], str | None]] = [
        (lambda: x.sum().item(), "aten._local_scalar_dense reads a tensor's value back to the host"),
        (lambda: x[x > 0].sum(), "aten.index makes a tensor whose shape depends on the data"),
        (lambda: x.nonzero(), "aten.nonzero makes a tensor whose shape depends on the data"),
        (lambda: HostRead.apply(x).sum().backward(), "aten._local_scalar_dense"),  # in the backward
        (lambda: x[torch.tensor([0, 2])].sum() * 2.0, None),  # a gather and a Python scalar: static
        (lambda: torch.repeat_interleave(x, torch.tensor([1] * 8), output_size=8), None),
        (lambda: (x * 3).sum().backward(), None),
    ]
    for run, want in cases:
        _, reason = graph_blocker(run, here)
        if want is None:
            assert reason is None, reason
        else:
            assert reason is not None and reason.startswith(want), reason
    y = x.detach()
    out, reason = graph_blocker(lambda: y + 1, torch.device("cuda"))  # a device object needs no GPU
    assert reason == "aten.add runs with a tensor on cpu, not on the device cuda"
    assert torch.equal(out, y + 1)  # the watch changes no value
    _, reason = graph_blocker(lambda: y.clone().index_put_((y > 0,), torch.tensor(0.0)), here)
    assert reason == "aten.index_put_ writes through a boolean mask (the positions are found on the host)"
    assert graph_blocker(lambda: y.clone().index_put_((torch.tensor([1, 3]),), torch.tensor(0.0)), here)[1] is None
    # on another device (meta stands for the GPU): a CPU scalar read is a kernel argument, but
    # copying one or writing one is not in a graph
    meta, scalar = torch.empty(3, device="meta"), torch.tensor(2.0)
    elsewhere = torch.device("meta")
    assert graph_blocker(lambda: meta * scalar, elsewhere)[1] is None
    assert graph_blocker(lambda: scalar.to("meta"), elsewhere)[1] == \
        "aten._to_copy runs with a tensor on cpu, not on the device meta"
    assert graph_blocker(lambda: scalar.fill_(1.0), elsewhere)[1] == \
        "aten.fill_ runs with a tensor on cpu, not on the device meta"
    # a higher-order op runs through the watch (the capture judges what it launches)
    got, reason = graph_blocker(lambda: torch.cond(y.sum() > 0, torch.sin, torch.cos, (y,)), here)
    assert reason is None and torch.equal(got, torch.sin(y) if y.sum() > 0 else torch.cos(y))


@pytest.mark.parametrize("make", [
    pytest.param(lambda: fc_mnist(1), id="fc_mnist"),
    pytest.param(lambda: debug_model("bert", 1), id="bert_debug"),
    pytest.param(lambda: debug_model("gpt2", 1), id="gpt2_debug"),
])
def test_the_reference_models_steps_hold_nothing_a_graph_cannot(make: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check a GPU runs at the first step, run here on the body as a GPU runs it (the graph,
    not the CPU's trace): a model change that reads a value back would make its GPU runs fall back.
    (Its rule for a tensor on another device cannot fire here, where every tensor is on the CPU.)"""
    monkeypatch.setenv("CSRUN_ENGINE_TRACE", "off")
    model, batches, opt = make()
    ep, spec = make_program(model, batches[0], optimizer=opt, learning_rate=SCHEDULE, max_gradient_norm=1.0)
    engine = Engine(ep, spec, notice=quiet, step_graph=True)
    leaves, tree = engine._checked_leaves(batches[0])
    (out, grads), reason = graph_blocker(lambda: engine._graph_body(pytree.tree_unflatten(leaves, tree)),
                                         torch.device("cpu"))
    assert reason is None
    assert out["loss"].isfinite() and len(grads) == len(engine.params) and all(g is not None for g in grads)


def test_the_switch_and_a_cpu_step_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cuda_graph.ENV, raising=False)
    assert cuda_graph.graph_mode() == "auto"
    monkeypatch.setenv(cuda_graph.ENV, "off")
    assert cuda_graph.graph_mode() == "off"
    monkeypatch.setenv(cuda_graph.ENV, "sometimes")
    with pytest.raises(ConfigError, match="CSRUN_CUDA_GRAPH: 'sometimes'"):
        cuda_graph.graph_mode()
    monkeypatch.delenv(cuda_graph.ENV)
    model, batches, opt = fc_mnist(1)
    ep, spec = make_program(model, batches[0], optimizer=opt)
    assert Engine(ep, spec, notice=quiet).step_graph is None  # a CPU engine has none unless asked
    graph = StepGraph(lambda inputs: ({"loss": inputs.sum()}, []), torch.device("cpu"), quiet, reset=lambda: None)
    out, state = graph.run([torch.ones(3)], pytree.tree_flatten(torch.ones(3))[1])
    assert graph.off == "no CUDA device" and not graph.captured and graph.replays == 0
    assert out["loss"].item() == 3.0 and state == []


class Phases(StepGraph):
    """A step graph that records which phase each step ran instead of running it (the order of
    the phases is :meth:`StepGraph._run`'s; what each phase does needs a GPU)."""

    def __init__(self) -> None:
        super().__init__(lambda inputs: ({}, []), torch.device("cpu"), quiet, reset=lambda: None)
        self.off = None  # as on a GPU
        self.seen: list[str] = []

    def _warm(self, leaves: list[Any], tree: Any, *, check: bool) -> cuda_graph.Outputs:
        self.seen.append("warm+check" if check else "warm")
        return {}, []

    def _capture(self, leaves: list[Any], tree: Any) -> cuda_graph.Outputs:
        self.seen.append("capture")
        self._graph = cast(Any, object())  # stands for the captured graph: never replayed here
        self._signature = cuda_graph._signature(leaves, tree)
        return {}, []

    def _replay(self, leaves: list[torch.Tensor], *, filled: bool = False) -> cuda_graph.Outputs:
        self.seen.append("replay")
        return {}, []

    def _eager(self, leaves: list[Any], tree: Any) -> cuda_graph.Outputs:
        self.seen.append("eager")
        return {}, []


def test_a_step_graph_warms_up_three_steps_checks_the_first_captures_the_fourth_then_replays() -> None:
    notices: list[str] = []
    graph = Phases()
    graph.notice = notices.append
    batch, other = torch.ones(2, 3), torch.ones(4, 3)
    tree = pytree.tree_flatten(batch)[1]
    for leaf in (batch,) * 6 + (other, other, batch):
        graph.steps += 1
        graph._run([leaf], tree)
    assert graph.seen == ["warm+check", "warm", "warm", "capture", "replay", "replay", "eager", "eager", "replay"]
    assert notices == ["CUDA graph: a batch's shapes or dtypes differ from the captured ones; such steps run "
                       "without the graph"]  # once
    graph.steps += 1
    graph._run([batch, 7], pytree.tree_flatten((batch, 7))[1])
    assert graph.seen[-1] == "eager" and graph.off is not None and not graph.captured
    assert notices[-1] == ("CUDA graph: the step runs without a graph: the batch's item 1 is a int, not a tensor: "
                           "a graph would keep its first value")


# -- the graph's step is the step without it, bit for bit ---------------------------------------

@pytest.mark.parametrize("make", [
    pytest.param(lambda: fc_mnist(100), id="fc_mnist-100-steps"),
    pytest.param(lambda: debug_model("bert", 6), id="bert_debug"),
    pytest.param(lambda: debug_model("gpt2", 6), id="gpt2_debug"),
])
def test_the_graphs_step_is_the_plain_steps_bits(make: Callable[[], tuple[nn.Module, list[Any], OptimizerSpec]]) -> None:
    model, batches, opt = make()
    graphed, plain = pair(model, batches, opt, learning_rate=SCHEDULE, max_gradient_norm=1.0)
    assert graphed.step_graph is not None and plain.step_graph is None
    a, b = run_both(graphed, plain, batches)
    assert_same_bits(graphed, plain, a, b)
    assert graphed.step_graph.steps == len(batches)


def test_dynamic_scaling_skips_the_same_steps_and_16_bit_emulation() -> None:
    batches = mlp_batches(12)
    for i in (3, 4, 9):  # overflows: the update is skipped, the scale halves
        x, y = batches[i]
        batches[i] = (x.clone().index_fill_(1, torch.tensor([0]), float("inf")), y)
    dynamic = LossScalingSpec(factor="dynamic", initial_loss_scale=2.0**10, steps_per_increase=2)
    for precision in ("float32", "float16"):
        graphed, plain = pair(MLP(), batches, OptimizerSpec(type="adamw"), precision=precision, loss_scaling=dynamic)
        if precision == "float16":
            assert graphed.half_weights is not None  # the CPU's rounding emulation: its leaves hold the gradients
        a, b = run_both(graphed, plain, batches)
        assert_same_bits(graphed, plain, a, b)
        assert graphed.scaler is not None and graphed.scaler.state.overflows == 3
        assert [s["loss_scale"].item() for s in a][:6] == [2.0**10, 2.0**10, 2.0**11, 2.0**11, 2.0**10, 2.0**9]
    # a static scale float32 cannot hold: the graph's device tensor is the plain step's Python scalar
    graphed, plain = pair(MLP(), batches[:3], OptimizerSpec(type="sgd"), loss_scaling=LossScalingSpec(factor=1000.3))
    assert_same_bits(graphed, plain, *run_both(graphed, plain, batches[:3]))


def test_accumulation_and_forward_only_steps_take_the_plain_path_where_they_must() -> None:
    batches = mlp_batches(9)
    hold, update = StepPlan(update=False), StepPlan(clear_grads=False)
    plans = [hold, StepPlan(update=False, clear_grads=False), update] * 2 + [StepPlan(backward=False, update=False)] + \
        [StepPlan(max_gradient_norm=0.5)] * 2
    graphed, plain = pair(MLP(), batches, OptimizerSpec(type="sgd", hyperparameters={"momentum": 0.5}))
    a, b = run_both(graphed, plain, batches, plans)
    assert_same_bits(graphed, plain, a, b)
    assert graphed.step_graph is not None
    assert graphed.step_graph.steps == 4  # the first of each accumulation, and the two clipped steps


class WeightOut(nn.Module):
    """Returns its weight beside the loss: an output that aliases what the update changes."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x).pow(2).mean(), self.lin.weight


def test_outputs_are_the_steps_values_a_moved_scale_and_early_handing_out() -> None:
    batches = [torch.randn(8, 4) for _ in range(4)]
    graphed, plain = pair(WeightOut(), batches, OptimizerSpec(type="sgd"))
    a, b = run_both(graphed, plain, batches)
    assert_same_bits(graphed, plain, a, b)  # output_1 is the weight before each step's update, on both paths
    assert not torch.equal(a[0]["output_1"], a[1]["output_1"])
    for engine in (graphed, plain):  # a static scale of 1 that a cluster's MemoryX moves (set_loss_scale)
        engine.set_loss_scale(8.0)
    a, b = run_both(graphed, plain, batches)
    assert_same_bits(graphed, plain, a, b)
    assert graphed.step_graph is not None and graphed.step_graph.steps == 8  # still through the graph
    handed: list[dict[str, torch.Tensor]] = []
    out = graphed.run_step(batches[0], publish=handed.append)
    assert len(handed) == 1 and handed[0] is out


def test_eval_steps_through_the_graph() -> None:
    batches = mlp_batches(3)
    ep, spec = make_program(MLP(), batches[0], mode="eval")
    graphed = Engine(ep, spec, notice=quiet, step_graph=True)
    plain = Engine(ep, spec, notice=quiet, step_graph=False)
    for batch in batches:
        assert torch.equal(graphed.run_step(batch)["loss"], plain.run_step(batch)["loss"])
    assert graphed.step_graph is not None and graphed.step_graph.steps == 3


# -- on a GPU: the capture, its replays, the fallback -------------------------------------------

@CUDA
@pytest.mark.parametrize("make", [
    pytest.param(lambda: fc_mnist(100), id="fc_mnist"),
    pytest.param(lambda: debug_model("bert", 100), id="bert_debug"),
    pytest.param(lambda: debug_model("gpt2", 100), id="gpt2_debug"),
])
def test_cuda_replays_are_the_plain_steps_bits_and_eagers(make: Model) -> None:
    model, batches, opt = make()
    graphed, plain = pair(model, batches, opt, "cuda", learning_rate=SCHEDULE)
    a, b = run_both(graphed, plain, batches)
    assert graphed.step_graph is not None and graphed.step_graph.captured
    assert graphed.step_graph.replays == len(batches) - cuda_graph.WARMUP_STEPS
    assert_same_bits(graphed, plain, a, b)
    eager = copy.deepcopy(model).cuda()
    from csrun.program.optimizer_classes import build_optimizer
    from csrun.program.schedules import build_schedule

    optimizer = build_optimizer(opt.type, dict(opt.hyperparameters), list(eager.named_parameters()), lr=0.01)
    schedule = build_schedule(SCHEDULE)
    for step, batch in enumerate(batches):
        for group in optimizer.param_groups:
            group["lr"] = schedule(step)
        out = eager(pytree.tree_map(lambda t: t.cuda(), batch))
        loss = out if isinstance(out, torch.Tensor) else out["loss"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        assert torch.equal(loss.detach().float().cpu(), a[step]["loss"]), f"step {step + 1}"
    trained = graphed.state_dict()["params"]
    for name, p in eager.named_parameters():
        assert torch.equal(p.detach().cpu(), trained[name]), name


@CUDA
def test_cuda_dynamic_scaling_and_mixed_precision() -> None:
    batches = mlp_batches(20)
    for i in (5, 6, 13):
        x, y = batches[i]
        batches[i] = (x.clone().index_fill_(1, torch.tensor([0]), float("inf")), y)
    graphed, plain = pair(MLP(), batches, OptimizerSpec(type="adamw"), "cuda",
                          loss_scaling=LossScalingSpec(factor="dynamic", initial_loss_scale=2.0**10, steps_per_increase=2))
    a, b = run_both(graphed, plain, batches)
    assert graphed.step_graph is not None and graphed.step_graph.captured
    assert graphed.step_graph.replays == len(batches) - cuda_graph.WARMUP_STEPS
    assert_same_bits(graphed, plain, a, b)
    assert graphed.scaler is not None and graphed.scaler.state.overflows == 3
    clean = mlp_batches(10, seed=1)
    graphed, plain = pair(MLP(), clean, OptimizerSpec(type="sgd"), "cuda", precision="float16")
    a, b = run_both(graphed, plain, clean)
    assert graphed.step_graph is not None and graphed.step_graph.captured
    for x, y in zip(a, b):
        assert x["loss"].isfinite() and torch.allclose(x["loss"], y["loss"], rtol=1e-3)


class DropoutMLP(MLP):
    """The default MLP with dropout on its hidden layer: random numbers drawn inside the step."""

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        hidden = nn.functional.dropout(torch.tanh(self.l1(x)), 0.3, training=self.training)
        return nn.functional.cross_entropy(self.l2(hidden), y)


def one_after_the_other(graphed: Engine, plain: Engine, batches: list[Any]) -> tuple[list[dict[str, torch.Tensor]], ...]:
    """Every step's outputs of each engine, each run from the same seed (dropout's masks: the
    graph's replays draw from the generator as the steps without it do)."""
    outs = []
    for engine in (graphed, plain):
        torch.manual_seed(7)
        outs.append([{k: v.detach().cpu() for k, v in engine.run_step(b).items()} for b in batches])
    return outs[0], outs[1]


def test_dropout_in_the_graphs_step_draws_as_the_plain_step() -> None:
    batches, model = mlp_batches(8), DropoutMLP()
    graphed, plain = pair(model, batches, OptimizerSpec(type="adamw"))
    a, b = one_after_the_other(graphed, plain, batches)
    assert_same_bits(graphed, plain, a, b)
    other, _ = pair(model, batches, OptimizerSpec(type="adamw"))
    torch.manual_seed(8)
    assert not torch.equal(other.run_step(batches[0])["loss"].detach().cpu(), a[0]["loss"])  # the masks are drawn


@CUDA
def test_cuda_dropout_replays_draw_as_the_plain_steps() -> None:
    batches = mlp_batches(12)
    graphed, plain = pair(DropoutMLP(), batches, OptimizerSpec(type="adamw"), "cuda")
    a, b = one_after_the_other(graphed, plain, batches)
    assert graphed.step_graph is not None and graphed.step_graph.captured
    assert graphed.step_graph.replays == len(batches) - cuda_graph.WARMUP_STEPS
    assert_same_bits(graphed, plain, a, b)


@CUDA
def test_cuda_a_failed_capture_runs_on_without_a_graph_and_dropout_still_draws() -> None:
    """A capture that fails where the first step's check cannot see (a synchronization only while
    capturing): one notice, the steps run on without a graph, and dropout outside a capture still
    works (torch leaves the generator in capture mode after a failed capture until another ends)."""

    def body(x: torch.Tensor) -> cuda_graph.Outputs:
        if torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()
        return {"loss": nn.functional.dropout(x, 0.5, training=True).sum()}, []

    notices: list[str] = []
    graph = StepGraph(body, torch.device("cuda"), notices.append, reset=lambda: None)
    x = torch.ones(64, 64)
    leaves, tree = pytree.tree_flatten(x)
    losses = [graph.run(leaves, tree)[0]["loss"].item() for _ in range(6)]
    assert not graph.captured and graph.off is not None and graph.off.startswith("the capture failed")
    assert len(notices) == 1 and notices[0].startswith("CUDA graph: the step runs without a graph: the capture failed"), notices
    assert all(0 < loss < 2 * 64 * 64 for loss in losses) and len(set(losses)) > 1, losses  # kept ones count 2


class MaskedLoss(nn.Module):
    """A loss over the positive outputs only: a boolean mask, whose result's shape depends on the data."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y[y > 0].sum()


@CUDA
def test_cuda_a_program_the_graph_cannot_hold_runs_without_it_after_one_notice() -> None:
    batches = [torch.randn(4, 8) for _ in range(6)]
    notices: list[str] = []
    ep, spec = make_program(MaskedLoss(), batches[0])
    graphed = Engine(ep, spec, "cuda", notice=notices.append)
    plain = Engine(ep, spec, "cuda", notice=quiet, step_graph=False)
    a, b = run_both(graphed, plain, batches)
    assert_same_bits(graphed, plain, a, b)
    said = [n for n in notices if n.startswith("CUDA graph")]
    assert said == ["CUDA graph: the step runs without a graph: aten.index makes a tensor whose shape depends on the data"]
    assert graphed.step_graph is not None and not graphed.step_graph.captured


@CUDA
def test_cuda_accumulation_clipping_a_checkpoint_load_and_eval_replays() -> None:
    """Replays beside plain steps that add into the graph's own gradient buffers, clipped updates,
    a state loaded into the engine after the capture (weights, optimizer, scale), eval replays."""
    batches = mlp_batches(24)
    hold, more, update = StepPlan(update=False), StepPlan(update=False, clear_grads=False), StepPlan(clear_grads=False)
    plans = [StepPlan(max_gradient_norm=0.5)] * 6 + [hold, more, update] * 4 + [StepPlan()] * 6
    graphed, plain = pair(MLP(), batches, OptimizerSpec(type="adamw"), "cuda",
                          loss_scaling=LossScalingSpec(factor="dynamic", initial_loss_scale=2.0**10))
    a, b = run_both(graphed, plain, batches[:12], plans[:12])
    saved = plain.state_dict()
    for engine in (graphed, plain):
        engine.load_state_dict(saved)
    c, d = run_both(graphed, plain, batches[12:], plans[12:])
    assert_same_bits(graphed, plain, a + c, b + d)
    assert graphed.step_graph is not None and graphed.step_graph.captured and graphed.step_graph.replays > 10
    ep, spec = make_program(MLP(), batches[0], mode="eval")
    evaluating = Engine(ep, spec, "cuda", notice=quiet)
    reference = Engine(ep, spec, "cuda", notice=quiet, step_graph=False)
    for batch in batches[:8]:
        assert torch.equal(evaluating.run_step(batch)["loss"].cpu(), reference.run_step(batch)["loss"].cpu())
    assert evaluating.step_graph is not None and evaluating.step_graph.replays == 8 - cuda_graph.WARMUP_STEPS
