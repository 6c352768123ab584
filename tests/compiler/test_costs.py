"""FLOP and byte counting per layer, and the placement's arithmetic."""

from __future__ import annotations

import pytest
import torch

from csrun.compiler import CompileSettings, WaferSpec, compile_only, validate_only
from csrun.compiler.costs import layer_costs
from csrun.compiler.errors import ConfigError
from csrun.compiler.placement import place

from tests.tiny_models import DeepMLP, TinyGPT


def _costs(model, batch, settings):  # noqa: ANN001, ANN202
    r = validate_only(model, batch, settings=settings)
    assert r.ok
    return {c.name: c for c in layer_costs(r.program, r.spec)}, r


def test_linear_flops_bytes_and_state() -> None:
    m = DeepMLP(d_in=16, hidden=32, depth=2, classes=4)
    costs, r = _costs(m, DeepMLP.batch(8), CompileSettings(optimizer=None, mixed_precision=True))
    assert costs["body.0"].forward_flops == 2 * 16 * 32 + 32
    assert costs["head"].forward_flops == 2 * 32 * 4 + 4
    assert costs["body.0"].params == 16 * 32 + 32 and costs["body.0"].weight_bytes == 4 * (16 * 32 + 32)
    assert costs["body.0"].activation_bytes == 32 * 2  # one float16 output row per sample
    from csrun.compiler.spec import OptimizerSpec
    from dataclasses import replace
    for kind, hp, slots in (("sgd", {"momentum": 0.9}, 1), ("sgd", {}, 0), ("adamw", {}, 2)):
        spec = replace(r.spec, optimizer=OptimizerSpec(type=kind, hyperparameters=hp))
        plan = place(layer_costs(r.program, spec), spec, WaferSpec())
        row = next(l for l in plan.layers if l.name == "body.0")
        assert row.optimizer_state_bytes == slots * 4 * (16 * 32 + 32)
        assert row.sram_needed_bytes <= row.sram_available_bytes


def test_attention_flops_counted() -> None:
    m = TinyGPT(vocab=64, hidden=32, layers=1, heads=2, msl=16)
    costs, _ = _costs(m, TinyGPT.batch(4, msl=16), CompileSettings())
    b = costs["blocks.0"]  # the SDPA call sits in the block's own forward
    heads, L, E = 2, 16, 16
    sdpa = 4 * heads * L * L * E + 5 * heads * L * L
    assert b.forward_flops >= sdpa
    assert costs["blocks.0.qkv"].forward_flops == L * (2 * 32 * 96 + 96)


def test_placement_balances_and_reports(tmp_path) -> None:  # noqa: ANN001
    m = TinyGPT()
    r = compile_only(m, TinyGPT.batch(), settings=CompileSettings(), optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                     model_dir=str(tmp_path), wafer=WaferSpec(num_pes=5000, sram_bytes=5000 * 48 * 1024))
    plan = r.plan
    assert r.ok and plan.pes_used <= 5000 and 0 < plan.total_utilization <= 1
    assert plan.est_samples_per_sec == pytest.approx(1 / max(l.stage_seconds_per_sample for l in plan.layers))
    assert plan.layers[0].samples_in_flight == 2 * len(plan.layers) - 1 and plan.layers[-1].samples_in_flight == 1
    # An explicit compile_dir holding someone else's files is refused, never deleted.
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    r2 = compile_only(m, TinyGPT.batch(), settings=CompileSettings(), optimizer=torch.optim.SGD(m.parameters(), lr=0.5),
                      compile_dir=str(other))
    assert not r2.ok and isinstance(r2.problems[0], ConfigError) and (other / "notes.txt").exists()


def test_a_tied_weight_counts_once() -> None:
    """torch.export gives each name of a tied weight its own placeholder; the costs count the tensor once."""

    class Tied(torch.nn.Module):
        """An embedding tied to the head around an untied layer: this test's counts are its sizes."""

        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(100, 16)
            self.lin = torch.nn.Linear(16, 16)
            self.head = torch.nn.Linear(16, 100, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.lin(self.emb(x))).float().logsumexp(-1).mean()

    m = Tied()
    costs, _ = _costs(m, torch.zeros(4, 8, dtype=torch.long), CompileSettings(optimizer=None, mixed_precision=False))
    assert sum(c.params for c in costs.values()) == sum(p.numel() for p in m.parameters())  # 1872, not 3472
    assert costs["emb"].params == 100 * 16 and costs["head"].params == 0  # at its first user


def test_a_pipelined_plan_that_does_not_fit_reports_no_utilization(tmp_path) -> None:  # noqa: ANN001
    from csrun.compiler.report import summary_lines

    m = TinyGPT()
    r = compile_only(m, TinyGPT.batch(), settings=CompileSettings(), optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                     model_dir=str(tmp_path), wafer=WaferSpec(num_pes=10, sram_bytes=10 * 1024))
    assert not r.ok and r.plan is not None and not r.plan.fits
    lines = summary_lines(r.plan)
    assert any("DOES NOT FIT" in ln for ln in lines)
    assert lines[-1].startswith("Utilization and throughput: not estimated (the model needs ") and "x the wafer's" in lines[-1]
    assert not any("% of PEs placed" in ln or "samples/s" in ln for ln in lines), lines
