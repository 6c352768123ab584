"""models/gpt2: forward/backward, causality, int32 inputs, capture + compile, debug data, learning."""

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

gpt2_model = load_module("gpt2", "model")
gpt2_data = load_module("gpt2", "data")
Batch = dict[str, torch.Tensor]


@pytest.fixture(scope="module")
def params() -> Params:
    return load_params("gpt2_debug", gpt2_model.Gpt2Config, gpt2_data.GptInputConfig)


@pytest.fixture(scope="module")
def batch(params: Params) -> Batch:
    return first_batch(hdf5_dataloader(gpt2_data.resolved(params.train_input), vocab_size=params.model.vocab_size))


def _model(params: Params, **changes: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    return gpt2_model.Gpt2LMHeadModel(dataclasses.replace(params.model, **changes))


def test_debug_data_batches(params: Params, batch: Batch) -> None:
    b, s = params.train_input.batch_size, params.train_input.max_sequence_length
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    for value in batch.values():
        assert value.shape == (b, s) and value.dtype == torch.int64
    real = batch["attention_mask"].bool()
    # labels are the inputs shifted left by one
    assert torch.equal(batch["labels"][:, :-1][real[:, 1:]], batch["input_ids"][:, 1:][real[:, 1:]])


def test_debug_data_is_reproducible_from_the_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    out = tmp_path / "debug"
    assert convert_main([*gpt2_data.DEBUG_CONVERT_FLAGS, "--output_dir", str(out), "--quiet"]) == 0
    with h5py.File(out / "shard_00000.h5") as new, h5py.File(gpt2_data.DEBUG_DATA_DIR / "shard_00000.h5") as old:
        assert set(new) == set(old)
        for name in old:
            np.testing.assert_array_equal(new[name][()], old[name][()], err_msg=name)


def test_forward_backward(params: Params, batch: Batch) -> None:
    model = _model(params)
    assert model.lm_head.weight is model.wte.weight
    out = model(batch)
    check_scalar_outputs(out)
    assert set(out) == {"loss", "lm_loss", "lm_xent", "lm_correct", "lm_count"}
    assert out["lm_count"] == batch["attention_mask"].sum()
    assert abs(float(out["loss"].detach()) - math.log(params.model.vocab_size)) < 1.0
    out["loss"].backward()
    check_grads(model)
    metrics = gpt2_model.gpt2_eval_metrics({k: float(v.detach()) for k, v in out.items()})
    assert metrics["perplexity"] == pytest.approx(math.exp(float(out["lm_loss"])), rel=1e-4)


def test_causal_and_int32(params: Params, batch: Batch) -> None:
    model = _model(params).eval()
    ids = batch["input_ids"]
    with torch.no_grad():
        ref = model.logits(ids)
        later = ids.clone()
        later[:, 10:] = 5  # changing tokens from position 10 on must not change logits before it
        torch.testing.assert_close(model.logits(later)[:, :10], ref[:, :10])
        as_int32 = {k: v.to(torch.int32) for k, v in batch.items()}
        torch.testing.assert_close(model(as_int32)["loss"], model(batch)["loss"])


def test_batch_size_loss_scaling(params: Params, batch: Batch) -> None:
    out = _model(params, loss_scaling="batch_size")(batch)
    torch.testing.assert_close(out["loss"], out["lm_xent"] / batch["input_ids"].shape[0])


def test_captures_compiles_and_runs_under_autocast(params: Params, batch: Batch, tmp_path: Path) -> None:
    model = _model(params)
    settings = CompileSettings(mode="train", learning_rate=params.optimizer.learning_rate)
    result = compile_only(model, batch, settings=settings, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                          model_dir=str(tmp_path))
    assert result.ok, [p.render() for p in result.problems]
    with torch.autocast("cpu", dtype=torch.float16):
        out = result.exported_program().module()(batch)
    assert torch.isfinite(out["loss"])


def test_loss_falls_on_debug_data(params: Params) -> None:
    loader = hdf5_dataloader(gpt2_data.resolved(params.train_input), vocab_size=params.model.vocab_size)
    losses = train_losses(_model(params), loader, steps=30, lr=3e-3)
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.4, losses
