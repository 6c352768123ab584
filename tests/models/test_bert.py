"""models/bert: forward/backward, padding mask, int32 inputs, capture + compile, debug data, learning."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from csrun.cli.cs_convert_hdf5 import main as convert_main
from csrun.compiler import CompileSettings, compile_only
from csrun.data import hdf5_dataloader
from csrun.run.params import Params

from .helpers import (
    REPO,
    check_grads,
    check_scalar_outputs,
    first_batch,
    load_module,
    load_params,
    train_losses,
)

bert_model = load_module("bert", "model")
bert_data = load_module("bert", "data")
Batch = dict[str, torch.Tensor]
KEYS = {"input_ids", "attention_mask", "token_type_ids", "masked_lm_positions", "masked_lm_ids",
        "masked_lm_weights", "next_sentence_label"}


@pytest.fixture(scope="module")
def params() -> Params:
    return load_params("bert_debug", bert_model.BertConfig, bert_data.BertInputConfig)


@pytest.fixture(scope="module")
def batch(params: Params) -> Batch:
    return first_batch(hdf5_dataloader(bert_data.resolved(params.train_input), vocab_size=params.model.vocab_size))


def _model(params: Params, **changes: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    return bert_model.BertPretrainModel(dataclasses.replace(params.model, **changes))


def test_debug_data_batches(params: Params, batch: Batch) -> None:
    cfg = params.train_input
    assert set(batch) == KEYS
    b, s, p = cfg.batch_size, cfg.max_sequence_length, cfg.max_predictions_per_seq
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        assert batch[name].shape == (b, s) and batch[name].dtype == torch.int64
    for name in ("masked_lm_positions", "masked_lm_ids"):
        assert batch[name].shape == (b, p) and batch[name].dtype == torch.int64
    assert batch["masked_lm_weights"].shape == (b, p) and batch["masked_lm_weights"].dtype == torch.float32
    assert batch["next_sentence_label"].shape == (b,)
    assert int(batch["input_ids"].max()) < params.model.vocab_size
    assert (batch["masked_lm_weights"].sum(1) >= 1).all()


def test_debug_data_is_reproducible_from_the_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    out = tmp_path / "debug"
    assert convert_main([*bert_data.DEBUG_CONVERT_FLAGS, "--output_dir", str(out), "--quiet"]) == 0
    with h5py.File(out / "shard_00000.h5") as new, h5py.File(bert_data.DEBUG_DATA_DIR / "shard_00000.h5") as old:
        assert set(new) == set(old)
        for name in old:
            np.testing.assert_array_equal(new[name][()], old[name][()], err_msg=name)


def test_forward_backward(params: Params, batch: Batch) -> None:
    model = _model(params)
    assert model.mlm_decoder.weight is model.embeddings.word.weight
    out = model(batch)
    check_scalar_outputs(out)
    assert set(out) == {"loss", "mlm_loss", "mlm_xent", "mlm_correct", "mlm_count", "nsp_loss", "nsp_correct", "nsp_count"}
    assert out["mlm_count"] == batch["masked_lm_weights"].sum()
    assert out["nsp_count"] == batch["input_ids"].shape[0]
    # an untrained model is near chance: ln(vocab) for MLM, ln(2) for NSP
    assert abs(float(out["mlm_loss"]) - math.log(params.model.vocab_size)) < 1.0
    torch.testing.assert_close(out["loss"], out["mlm_loss"] + out["nsp_loss"])
    out["loss"].backward()
    check_grads(model)
    metrics = bert_model.bert_eval_metrics({k: float(v.detach()) for k, v in out.items()})
    assert set(metrics) == {"mlm_accuracy", "mlm_perplexity", "nsp_accuracy"}
    assert metrics["mlm_perplexity"] == pytest.approx(math.exp(float(out["mlm_loss"])), rel=1e-4)


def test_int32_inputs_and_padding_mask(params: Params, batch: Batch) -> None:
    model = _model(params).eval()
    with torch.no_grad():
        ref = model(batch)
        as_int32 = {k: v.to(torch.int32) if not v.is_floating_point() else v for k, v in batch.items()}
        torch.testing.assert_close(model(as_int32)["loss"], ref["loss"])
        # what sits at padded positions must not matter
        noisy = dict(batch)
        noisy["input_ids"] = torch.where(batch["attention_mask"].bool(), batch["input_ids"], 7)
        torch.testing.assert_close(model(noisy)["loss"], ref["loss"])


def test_mlm_only_and_legacy_loss_scaling(params: Params, batch: Batch) -> None:
    out = _model(params, disable_nsp=True, mlm_loss_scaling="batch_size", mlm_loss_weight=0.5)(batch)
    check_scalar_outputs(out)
    assert "nsp_loss" not in out
    torch.testing.assert_close(out["loss"], 0.5 * out["mlm_xent"] / batch["input_ids"].shape[0])


def test_bad_model_config_is_refused(params: Params) -> None:
    from csrun.typed_config import ConfigError
    with pytest.raises(ConfigError, match="num_heads"):
        dataclasses.replace(params.model, num_heads=3)


def test_captures_compiles_and_runs_under_autocast(params: Params, batch: Batch, tmp_path: Path) -> None:
    model = _model(params)
    settings = CompileSettings(mode="train", learning_rate=params.optimizer.learning_rate)
    result = compile_only(model, batch, settings=settings, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                          model_dir=str(tmp_path))
    assert result.ok, [p.render() for p in result.problems]
    program = result.exported_program().module()
    # the device runs the captured forward under float16 autocast: it must not pin float32 dtypes
    with torch.autocast("cpu", dtype=torch.float16):
        out = program(batch)
    assert torch.isfinite(out["loss"])


def test_loss_falls_on_debug_data(params: Params) -> None:
    loader = hdf5_dataloader(bert_data.resolved(params.train_input), vocab_size=params.model.vocab_size)
    losses = train_losses(_model(params), loader, steps=30, lr=2e-3)
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5, losses
