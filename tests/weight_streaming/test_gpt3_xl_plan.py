"""GPT-3 XL compiles in weight-streaming mode (on meta tensors, in seconds) and is refused pipelined with the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from tests.weight_streaming.conftest import GPT3_DEBUG, GPT3_XL

COMPILE = ("-m", "train", "-p", str(GPT3_XL), "--compile_only", "--shapes_only")


def test_gpt3_xl_fits_weight_streaming(gpt: Callable[..., int], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpt(*COMPILE, "-o", str(tmp_path)) == 0  # the YAML says weight_streaming
    out = capsys.readouterr().out
    assert "Compile for training completed successfully!" in out
    (folder,) = tmp_path.glob("cs_*")
    plan = json.loads((folder / "plan.json").read_text())
    estimate = json.loads((folder / "estimate.json").read_text())
    assert plan["execution_strategy"] == estimate["execution_strategy"] == "weight_streaming"
    assert "MemoryX" in plan["why"] and "pipelined it would need" in plan["why"] and "(does not fit)" in plan["why"]
    assert plan["fits"] and plan["sram_needed_bytes"] <= plan["sram_available_bytes"] == 40e9
    params = sum(row["grad_bytes"] for row in plan["layers"]) / 4
    assert 1.3e9 < params < 1.5e9  # 1.3B (the tied LM head is counted with its own layer group)
    names = [row["name"] for row in plan["layers"]]
    assert [n for n in names if n.startswith("blocks.")] == [f"blocks.{i}" for i in range(24)]  # a block at a time
    assert {"wte", "wpe", "final_norm", "lm_head"} <= set(names)
    assert 1 <= plan["micro_batch_size"] < 256 and 256 % plan["micro_batch_size"] == 0
    assert plan["memoryx"]["fits"] and plan["memoryx"]["needed_bytes"] > 16 * 1.3e9  # weights, copies, AdamW, grads
    assert estimate["assumptions"]["weight_bandwidth_bytes_per_s"] == plan["memoryx"]["weight_bandwidth_bytes_per_s"] > 0
    assert estimate["assumptions"]["gradient_bandwidth_bytes_per_s"] > 0
    assert estimate["est_samples_per_sec"] > 0 and estimate["batch_size"] == 256
    # every step streams each group's weights in twice per micro batch and its gradients out once
    passes = 256 // plan["micro_batch_size"]
    weights = sum(row["weight_bytes"] for row in plan["layers"])
    assert plan["weight_stream_bytes_per_step"] == pytest.approx(2 * passes * weights)
    assert plan["gradient_stream_bytes_per_step"] == pytest.approx(passes * params * 4)
    report = (folder / "report.txt").read_text()
    assert "Execution strategy: weight_streaming" in report and "GB/s" in report


def test_gpt3_xl_pipelined_is_refused_with_the_weight_streaming_fix(gpt: Callable[..., int], tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert gpt(*COMPILE, "-o", str(tmp_path), "--execution_strategy", "pipeline") == 1
    out = capsys.readouterr().out
    assert "ModelDoesNotFit: " in out and "Compile failed" in out
    flat = " ".join(out.split())
    assert "the model does not fit on WSE-2 (estimate)" in flat
    assert ("or train it in weight-streaming mode (python-ws, or run.py --execution_strategy weight_streaming, or "
            "runconfig.execution_strategy: weight_streaming): its plan fits") in flat
    assert not list(tmp_path.glob("cs_*"))


def test_shapes_only_needs_a_compile_flag(gpt: Callable[..., int], capsys: pytest.CaptureFixture[str]) -> None:
    assert gpt("-m", "train", "-p", str(GPT3_DEBUG), "--shapes_only") == 2
    assert "--shapes_only: meta tensors have no values to train on" in capsys.readouterr().err


def test_each_strategy_compiles_to_its_own_directory(gpt: Callable[..., int], tmp_path: Path) -> None:
    base = ("-m", "train", "-p", str(GPT3_DEBUG), "--compile_only", "--shapes_only", "-o", str(tmp_path))
    assert gpt(*base) == 0
    assert gpt(*base, "--execution_strategy", "weight_streaming") == 0
    modes = sorted(json.loads((d / "plan.json").read_text())["execution_strategy"] for d in tmp_path.glob("cs_*"))
    assert modes == ["pipeline", "weight_streaming"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("flag", ["--compile_only", "--validate_only"])
def test_a_gpt3_xl_compile_without_shapes_only_allocates_no_weights(tmp_path: Path, flag: str) -> None:
    """A compile needs shapes, not weights: without --shapes_only the command stays far below the
    23 GB it grew to (an OOM kill on a 24 GB machine); peak RSS of the run's process, not a timing."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    run_py = [sys.executable, str(root / "models" / "gpt2" / "run.py"), "-m", "train", "-p", str(GPT3_XL), flag,
              "-o", str(tmp_path)]
    measure = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
               "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")  # this run's own child only
    done = subprocess.run([sys.executable, "-c", measure, *run_py], capture_output=True, text=True, timeout=170,
                          cwd=tmp_path)
    rc, peak_kib = map(int, done.stdout.split()[-2:])
    assert rc == 0, done.stderr[-2000:]
    assert peak_kib < 2 * 1024 * 1024  # under 2 GiB
