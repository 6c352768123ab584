"""Every configs/bert_*.yaml and configs/gpt2_*.yaml loads, builds its schedule, and bert_base_msl128 holds the legacy values."""

from __future__ import annotations

import pytest

from csrun.data import HDF5Dataset
from csrun.program.schedules import build_schedule

from .helpers import CONFIGS, load_module, load_params

BERT = (load_module("bert", "model").BertConfig, load_module("bert", "data").BertInputConfig)
GPT2 = (load_module("gpt2", "model").Gpt2Config, load_module("gpt2", "data").GptInputConfig)
ALL = sorted([(p.stem, BERT) for p in CONFIGS.glob("bert_*.yaml")] + [(p.stem, GPT2) for p in CONFIGS.glob("gpt2_*.yaml")])


def test_every_expected_config_exists() -> None:
    names = {name for name, _ in ALL}
    assert {"bert_base_msl128", "bert_base_msl512", "bert_large_msl128", "bert_debug", "gpt2_small", "gpt2_debug"} <= names


@pytest.mark.parametrize("name,classes", ALL, ids=[n for n, _ in ALL])
def test_config_loads(name: str, classes: tuple[type, type]) -> None:
    params = load_params(name, *classes)
    assert isinstance(params.model, classes[0])
    assert isinstance(params.train_input, classes[1]) and isinstance(params.eval_input, classes[1])
    schedule = build_schedule(params.optimizer.learning_rate)
    assert schedule(0) >= 0.0
    for section in (params.train_input, params.eval_input):
        assert section.max_sequence_length <= params.model.max_position_embeddings
        assert section.drop_last_batch


@pytest.mark.parametrize("name,model", [("bert_debug", "bert"), ("gpt2_debug", "gpt2")])
def test_debug_configs_match_the_bundled_data(name: str, model: str) -> None:
    data = load_module(model, "data")
    params = load_params(name, *(BERT if model == "bert" else GPT2))
    for section in (params.train_input, params.eval_input):
        assert section.data_dir == ""
        config = data.resolved(section)
        config.check_against(HDF5Dataset(config.data_dir).metadata, vocab_size=params.model.vocab_size)  # raises on any mismatch
        assert config.data_dir == str(data.DEBUG_DATA_DIR)


def test_bert_base_msl128_holds_the_legacy_values() -> None:
    p = load_params("bert_base_msl128", *BERT)
    m, o, r = p.model, p.optimizer, p.runconfig
    assert (m.vocab_size, m.hidden_size, m.num_hidden_layers, m.num_heads, m.filter_size) == (30522, 768, 12, 12, 3072)
    assert m.encoder_nonlinearity == "gelu" and m.dropout_rate == 0.1 and m.mixed_precision is True
    for section in (p.train_input, p.eval_input):
        assert section.max_sequence_length == 128 and section.max_predictions_per_seq == 20
    assert p.train_input.batch_size == 256
    assert o.optimizer_type == "adamw" and o.weight_decay_rate == 0.01
    assert o.learning_rate == [
        {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1e-4, "steps": 10000},
        {"scheduler": "Linear", "initial_learning_rate": 1e-4, "end_learning_rate": 0.0, "steps": 1000000},
    ]
    schedule = build_schedule(o.learning_rate)
    assert schedule(0) == 0.0 and schedule(5000) == pytest.approx(5e-5) and schedule(10000) == pytest.approx(1e-4)
    assert schedule(510000) == pytest.approx(5e-5)
    assert o.loss_scaling_factor == "dynamic" and o.max_gradient_norm == 1.0
    assert r.max_steps == 900000 and r.checkpoint_steps == 5000 and r.save_initial_checkpoint is True


def test_bert_large_and_gpt2_small_sizes() -> None:
    large = load_params("bert_large_msl128", *BERT).model
    assert (large.num_hidden_layers, large.hidden_size, large.num_heads, large.filter_size) == (24, 1024, 16, 4096)
    p = load_params("gpt2_small", *GPT2)
    g = p.model
    assert (g.vocab_size, g.max_position_embeddings, g.hidden_size, g.num_hidden_layers, g.num_heads) == (50257, 1024, 768, 12, 12)
    assert g.mixed_precision is True and p.optimizer.optimizer_type == "adamw"
    assert p.train_input.max_sequence_length == 1024


@pytest.mark.parametrize("name,model", [("bert_debug", "bert"), ("gpt2_debug", "gpt2")])
def test_weight_decay_exclusions_match_biases_and_norms(name: str, model: str) -> None:
    params = load_params(name, *(BERT if model == "bert" else GPT2))
    built = getattr(load_module(model, "model"), f"{model}_model")(params)
    excluded = params.optimizer.exclude_from_weight_decay
    for pname, p in built.named_parameters():
        hit = any(s in pname for s in excluded)
        assert hit == (p.dim() == 1), f"{pname} ({p.dim()}-d) excluded={hit}"
