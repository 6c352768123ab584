"""The issue's "done when", on the local Slurm cluster (``slurm/local-cluster start --workers 4 --systems 2``):

    csrun_wse --num-csx 2 python-ws models/gpt2/run.py -m train -p configs/gpt2_debug.yaml

trains with the same losses as one system at twice the batch. The config is gpt2_debug's in
float32 (mixed_precision: false) with the loss divided by the batch size (``loss_scaling:
batch_size``): with ``num_tokens`` each system divides by its own batch's real tokens, as on the
cluster, and the mean of those is not one system's division by all of them. The systems land on
cs-sys1 and cs-sys2, each holding the system's GRES; the loss a closure reads is the cluster's mean.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from csrun.run.summaries import read_losses
from tests.conftest import BIN, REPO
from tests.reduction_order import ROUNDING_BOUND
from tests.slurm.nodes import pinned_env

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(2400)]  # generous: the cluster is shared and busy
STEPS = 30


def config(tmp: Path, batch: int) -> Path:
    data = yaml.safe_load((REPO / "configs" / "gpt2_debug.yaml").read_text())
    data["train_input"]["batch_size"] = batch
    data["model"].update(mixed_precision=False, loss_scaling="batch_size")
    data["runconfig"].update(save_losses=True, save_initial_checkpoint=False, checkpoint_steps=STEPS)
    path = tmp / f"gpt2_{batch}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_two_systems_on_slurm_train_gpt2_as_one_at_twice_the_batch(slurm_env: dict[str, str], tmp_path: Path) -> None:
    env = {**pinned_env(slurm_env), "PATH": f"{BIN}:{slurm_env['PATH']}", "OMP_NUM_THREADS": "1"}  # placement asked
    line = (f"csrun_wse --num-csx 2 --log-dir {tmp_path / 'logs'} python-ws models/gpt2/run.py -m train "
            f"-p {config(tmp_path, 4)} -o {tmp_path / 'two'} --max_steps {STEPS}")
    two = subprocess.run(["bash", "-c", line], env=env, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert two.returncode == 0, two.stdout[-4000:] + two.stderr[-4000:]
    one = subprocess.run(["bash", "-c", f"python-ws models/gpt2/run.py -m train -p {config(tmp_path, 8)} "
                          f"-o {tmp_path / 'one'} --max_steps {STEPS} --cs_ip embedded"],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert one.returncode == 0, one.stdout[-4000:] + one.stderr[-4000:]
    a, b = dict(read_losses(tmp_path / "one")), dict(read_losses(tmp_path / "two"))
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1)), (a, b)
    worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
    assert worst <= ROUNDING_BOUND, worst  # AdamW: reduction-order rounding only (tests/reduction_order.py)
    nodes = {}
    for log in (tmp_path / "logs").glob("*.log"):
        found = re.match(r"=== csrun task rank (\d+) on (\S+),", log.read_text())
        assert found, log
        nodes[int(found.group(1))] = found.group(2)
    assert {nodes[1], nodes[2]} == {"cs-sys1", "cs-sys2"} and nodes[3].startswith("cs-w")
    assert "Cluster (estimate): 2 systems x 4 samples = 8 samples a step" in two.stdout
