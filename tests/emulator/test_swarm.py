"""N systems with MemoryX and SwarmX on MPI train as one system at batch N·B (issue 35, numerics).

tests/emulator/scripts/swarm_job.py under a real ``mpiexec`` (MemoryX and 2 or 3 systems, per-system
batch 8) against one engine at batch N·8 on the same global batches, 100 steps, with clipping and
dynamic loss scaling, SGD with momentum and AdamW: the cluster's mean losses and the final weights
equal the single system's up to the reduction order's rounding (tests/reduction_order.py's bound,
1e-4 relative: what a rounding cannot reach and a semantic error passes); one system's overflow
skips the step on all and moves the scale once, as the single system's does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, base_env
from tests.reduction_order import ROUNDING_BOUND

MPIEXEC = Path(sys.executable).parent / "mpiexec"
SCRIPT = Path(__file__).parent / "scripts" / "swarm_job.py"
pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("optimizer, systems", [("sgd", 2), ("adamw", 3)])
def test_n_systems_train_as_one_at_n_times_the_batch(tmp_path: Path, optimizer: str, systems: int) -> None:
    out = tmp_path / "swarm.json"
    done = subprocess.run([str(MPIEXEC), "-n", str(systems + 1), sys.executable, str(SCRIPT), str(out), optimizer],
                          env={**base_env(), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240,
                          cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["systems"] == systems and got["global_step"] == got["ref_global_step"] == 100
    assert got["loss_rel"] <= ROUNDING_BOUND and got["weights_rel"] <= ROUNDING_BOUND, got
    assert got["scales"] == got["ref_scales"], "the loss scale moved differently"
    assert got["scales"][38] == got["scales"][37] / 2  # one system's overflow: the step skipped, the scale halved once
