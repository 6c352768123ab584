"""The engine's traced forward (csrun/emulator/engine/traced_forward.py) is the captured graph, bit for bit.

Each model trains the same batches twice from the same seed, once with the trace
(``CSRUN_ENGINE_TRACE=auto``, the CPU default) and once running the FX graph (``off``): every
step's outputs and the final weights, optimizer state and buffers must be equal bit for bit.
The models cover what could go wrong in a trace: dict batches and tuple outputs, batch norm's
buffer updates, dropout's random draws, a tied weight, float16 emulated by rounding (its
weight leaves are re-created on load), an eval program, and the BERT debug model.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

from csrun.emulator.engine import traced_forward
from csrun.emulator.engine.executor import Engine
from csrun.emulator.engine.traced_forward import TracedForward
from csrun.errors import ConfigError

from tests.tiny_models import MLP, DropoutConvNet, TinyTransformer, conv_batches, lm_batches, mlp_batches
from ..models.helpers import first_batch, load_module, load_params
from .helpers import input_specs, make_spec, quiet


class TiedLM(nn.Module):
    """An embedding whose weight is also the output projection's, and nothing else: shaped for
    the test that the tie stays one parameter (the archive tests' TiedLM adds an untied layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.head = nn.Linear(16, 32, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        logits = self.head(torch.tanh(self.emb(batch["input_ids"])))
        loss = nn.functional.cross_entropy(logits.reshape(-1, 32), batch["labels"].reshape(-1))
        return {"loss": loss, "logits": logits}


def bert_debug() -> tuple[nn.Module, list[Any]]:
    """The BERT debug model (dropout as its config has it) and one real batch, used 3 times."""
    from csrun.data import hdf5_dataloader

    model_mod, data_mod = load_module("bert", "model"), load_module("bert", "data")
    params = load_params("bert_debug", model_mod.BertConfig, data_mod.BertInputConfig)
    batch = first_batch(hdf5_dataloader(data_mod.resolved(params.train_input), vocab_size=params.model.vocab_size))
    torch.manual_seed(0)
    model = model_mod.BertPretrainModel(dataclasses.replace(params.model, dropout_rate=0.1, attention_dropout_rate=0.1))
    return model, [batch] * 3


def _spec(kind: str, batch: Any, **kw: Any) -> Any:
    from csrun.compiler.spec import OptimizerSpec

    hp = {"sgd": {"momentum": 0.9}, "adamw": {"weight_decay": 0.01}}[kind]
    return make_spec(optimizer=OptimizerSpec(type=kind, hyperparameters=hp), inputs=input_specs(batch), **kw)


def _train(model: nn.Module, batches: list[Any], spec: Any, mode: str, monkeypatch: pytest.MonkeyPatch,
           *, steps_from_state: dict[str, Any] | None = None) -> tuple[Engine, list[dict[str, torch.Tensor]]]:
    monkeypatch.setenv(traced_forward.ENV, mode)
    torch.manual_seed(0)
    program = torch.export.export(copy.deepcopy(model), (batches[0],))
    engine = Engine(program, spec, notice=quiet)
    if steps_from_state is not None:
        engine.load_state_dict(steps_from_state)
    torch.manual_seed(1234)  # dropout draws from here, in both runs
    outs = [{k: v.clone() for k, v in engine.run_step(b).items()} for b in batches]
    return engine, outs


def _assert_same_run(model: nn.Module, batches: list[Any], spec: Any, monkeypatch: pytest.MonkeyPatch) -> Engine:
    traced, outs_t = _train(model, batches, spec, "auto", monkeypatch)
    graph, outs_g = _train(model, batches, spec, "off", monkeypatch)
    assert isinstance(traced._forward, TracedForward), "the trace was not used"
    assert graph._forward is graph.module
    for step, (a, b) in enumerate(zip(outs_t, outs_g)):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), f"step {step}: output {key} differs"
    state_t, state_g = traced.state_dict(), graph.state_dict()
    flat_t, _ = torch.utils._pytree.tree_flatten(state_t)
    flat_g, _ = torch.utils._pytree.tree_flatten(state_g)
    assert len(flat_t) == len(flat_g)
    for a, b in zip(flat_t, flat_g):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)
        else:
            assert a == b
    return traced


def test_mlp_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = mlp_batches(6)
    _assert_same_run(MLP(), batches, _spec("sgd", batches[0]), monkeypatch)


def test_transformer_with_dict_batches_tuple_outputs_float16_by_rounding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CSRUN_HALF_EMULATION", "rounding")
    batches = lm_batches(5)
    engine = _assert_same_run(TinyTransformer(), batches,
                              _spec("adamw", batches[0], precision="float16"), monkeypatch)
    assert engine.half_weights is not None


def test_batch_norm_buffers_and_dropout_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = conv_batches(6)
    engine = _assert_same_run(DropoutConvNet(), batches, _spec("sgd", batches[0]), monkeypatch)
    running = [v for k, v in engine.module.state_dict().items() if k.endswith("running_mean")]
    assert running and not torch.equal(running[0], torch.zeros_like(running[0])), "the buffers did not move"


def test_a_tied_weight_stays_tied(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = lm_batches(5)
    engine = _assert_same_run(TiedLM(), batches, _spec("adamw", batches[0]), monkeypatch)
    assert len(engine.params) == 1


def test_the_bert_debug_model_with_dropout(monkeypatch: pytest.MonkeyPatch) -> None:
    model, batches = bert_debug()
    _assert_same_run(model, batches, _spec("adamw", batches[0]), monkeypatch)


def test_an_eval_program(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = mlp_batches(3)
    spec = dataclasses.replace(_spec("sgd", batches[0]), mode="eval", optimizer=None)
    _assert_same_run(MLP(), batches, spec, monkeypatch)


def test_a_loaded_state_is_what_the_trace_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_state_dict after the trace was built (float16 emulation re-creates its weight leaves)."""
    monkeypatch.setenv("CSRUN_HALF_EMULATION", "rounding")
    batches = lm_batches(4)
    spec = _spec("adamw", batches[0], precision="float16")
    source, _ = _train(TinyTransformer(), batches, spec, "off", monkeypatch)
    state = source.state_dict()
    results = []
    for mode in ("auto", "off"):
        engine, _ = _train(TinyTransformer(), batches[:1], spec, mode, monkeypatch)
        engine.load_state_dict(state)
        results.append([engine.run_step(b)["loss"].clone() for b in batches])
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_off_and_a_trace_that_differs_run_the_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = mlp_batches(2)
    spec = _spec("sgd", batches[0])
    engine, _ = _train(MLP(), batches, spec, "off", monkeypatch)
    assert engine._forward is engine.module
    monkeypatch.setattr(traced_forward, "_agree", lambda *a: False)
    engine, _ = _train(MLP(), batches, spec, "auto", monkeypatch)
    assert engine._forward is engine.module


def test_an_unknown_mode_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(traced_forward.ENV, "sometimes")
    with pytest.raises(ConfigError, match="CSRUN_ENGINE_TRACE: 'sometimes' is not one of 'auto', 'off'"):
        traced_forward.trace_mode()
