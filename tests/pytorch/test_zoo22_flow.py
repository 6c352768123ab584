"""A miniature of the 2.2.1 Model Zoo's flow (``tests/pytorch/scripts/minizoo22``: the zoo's
calls, its ``cerebras.minizoo`` namespace package beside the shim, ``CSConfig`` with the zoo's
defaults, backend keywords, a schedule list as ``learning_rate``, ``DataExecutor`` keywords, a
checkpoint before the loop, ``set_half_dtype`` with mixed precision off, ``clip_grad_norm_``
in the traced step, a self-sharding batch sampler, int32 labels a model checks, float16
features, an accuracy metric updated inside ``forward``), on the CPU and under
``csrun_wse --legacy-imports --total-nodes 3``: the device's float32 losses are the CPU's, only
the chief runs the flow, every sample comes once per epoch, and eval metrics agree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BIN

RUN = Path(__file__).parent / "scripts" / "minizoo22" / "run.py"
STEPS = 20
pytestmark = pytest.mark.timeout(300)


def flow(env: dict[str, str], launcher: list[str], target: str, model_dir: Path, *extra: str) -> dict:
    model_dir.mkdir(parents=True, exist_ok=True)
    mode = extra[0] if extra and not extra[0].startswith("--") else "train"
    done = subprocess.run([*launcher, sys.executable, str(RUN), target, str(model_dir), str(STEPS), *extra],
                          env=env, capture_output=True, text=True, timeout=240, cwd=RUN.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((model_dir / f"result_{mode}.json").read_text())


def test_three_tasks_on_the_device_train_and_evaluate_as_the_cpu(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    cpu = [str(BIN / "csrun_cpu"), "--legacy-imports"]
    wse = [str(BIN / "csrun_wse"), "--legacy-imports", "--total-nodes", "3"]
    reference = flow(no_slurm_env, cpu, "CPU", tmp_path / "cpu")
    device = flow(no_slurm_env, wse, "CSX", tmp_path / "csx")
    assert len(device["losses"]) == len(reference["losses"]) == STEPS and device["final"]
    assert max(abs(a - b) for a, b in zip(device["losses"], reference["losses"])) <= 1e-5
    assert device["tasks"] == 3 and device["batches"] == 96 // 8 and device["samples"] == STEPS * 8
    for epoch_start in (0,):  # 12 batches an epoch: every sample exactly once
        assert sorted(device["seen"][epoch_start:epoch_start + 96]) == list(range(96))
    assert device["seen"] == reference["seen"]  # the self-sharding sampler's order, not sharded again
    model_dir = tmp_path / "csx"
    assert sorted(p.name for p in model_dir.glob("flow_ran_on_rank_*")) == ["flow_ran_on_rank_0"]
    assert len(list((model_dir / "cerebras_logs" / "train").iterdir())) == 1  # one artifact folder
    assert {p.name for p in model_dir.glob("checkpoint_*.mdl")} == {"checkpoint_0.mdl", f"checkpoint_{STEPS}.mdl"}
    assert list((model_dir / "train").glob("events.out.tfevents.*"))  # summarize_scalar through the writer
    [spec] = model_dir.glob("cerebras_logs/train/*/cs_*/spec.json")
    recorded = json.loads(spec.read_text())
    assert recorded["precision"] == "float32"  # set_half_dtype chose a type; mixed precision stayed off
    dtypes = {t["dtype"] for t in recorded["inputs"]}
    assert "int32" in dtypes and "float16" not in dtypes  # labels as streamed, float16 features widened
    evaluated = flow(no_slurm_env, wse, "CSX", tmp_path / "csx", "eval")
    eager = flow(no_slurm_env, cpu, "CPU", tmp_path / "csx", "eval")  # the device's weights, eagerly
    assert evaluated["losses"] == pytest.approx(eager["losses"], abs=1e-6)
    assert evaluated["metrics"] == pytest.approx(eager["metrics"]) and set(evaluated["metrics"]) == {"eval/accuracy"}


def test_clipping_in_the_traced_step_is_the_devices_own(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    """clip_grad_norm_ inside ``@cstorch.trace`` changes the run on the device as on the CPU."""
    cpu = [str(BIN / "csrun_cpu"), "--legacy-imports"]
    one = [str(BIN / "csrun_wse"), "--legacy-imports", "--total-nodes", "1"]
    unclipped_cpu = flow(no_slurm_env, cpu, "CPU", tmp_path / "cpu", "--no-clip")
    clipped_cpu = flow(no_slurm_env, cpu, "CPU", tmp_path / "cpu-clip")
    unclipped = flow(no_slurm_env, one, "CSX", tmp_path / "csx", "--no-clip")
    assert max(abs(a - b) for a, b in zip(unclipped_cpu["losses"], clipped_cpu["losses"])) > 1e-3
    assert max(abs(a - b) for a, b in zip(unclipped["losses"], unclipped_cpu["losses"])) <= 1e-5


@pytest.mark.parametrize("ending, rc", [("pass", 0), ("raise SystemExit(3)", 3)])
def test_streamers_waiting_for_a_role_leave_when_the_chief_ends_without_a_loop(
        no_slurm_env: dict[str, str], tmp_path: Path, ending: str, rc: int) -> None:
    """A 2.x script whose chief never reaches a loop: the streamers, waiting for their role, end with it."""
    script = tmp_path / "no_loop.py"
    script.write_text("import csrun.pytorch as cstorch\n"
                      "open(f'ran_{cstorch.distributed.get_ordinal()}', 'w').close()\n" + ending + "\n")
    done = subprocess.run([str(BIN / "csrun_wse"), "--total-nodes", "3", sys.executable, str(script)],
                          env=no_slurm_env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == rc, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.glob("ran_*")) == ["ran_0"]  # the streamers never ran the script on
