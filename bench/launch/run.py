"""Launch overhead: ``csrun_cpu true`` and ``csrun_wse true`` against bare ``srun true``.

Command (with the local cluster up, from the repository root)::

    .venv/bin/python bench/launch/run.py --repeats 9

Runs the three commands interleaved, ``--repeats`` times each, on the local Slurm cluster
(``slurm/local-cluster start``; SLURM_CONF taken from its status), and prints the median wall
time of each and the median ratio to ``srun true`` measured in the same run, as a markdown
table. csrun_wse is the one-node step (``--total-nodes 1 --tasks-per-node 1``), the same
single task as the baseline; srun runs with the same ``--nodes=1`` request.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def slurm_conf() -> str:
    """SLURM_CONF of the running local cluster (exits with a message when it is down)."""
    done = subprocess.run([str(REPO / "slurm" / "local-cluster"), "status"], capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("export SLURM_CONF="):
            return line.split("=", 1)[1].strip().strip("'\"")
    sys.exit("bench/launch: the local cluster is not running (slurm/local-cluster start)")


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one run; exits if the command fails."""
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"bench/launch: {' '.join(argv)} failed: {done.stderr.strip()}")
    return elapsed


def main() -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    env = dict(os.environ, SLURM_CONF=slurm_conf(), PYTHONPATH=str(REPO), CSRUN_PYTHON=sys.executable)
    bin_dir = Path(sys.executable).parent
    cases = {
        "srun true": ["srun", "--nodes=1", "--ntasks=1", "true"],
        "csrun_cpu true": [str(REPO / "bin" / "csrun_cpu"), "--logging", "False", "true"],
        "csrun_wse true": [str(REPO / "bin" / "csrun_wse"), "--logging", "False", "--total-nodes", "1", "--tasks-per-node", "1", "true"],
    }
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    times: dict[str, list[float]] = {name: [] for name in cases}
    for name, argv in cases.items():  # warm-up
        timed(argv, env)
    for _ in range(args.repeats):
        for name, argv in cases.items():
            times[name].append(timed(argv, env))
    base = times["srun true"]
    print(f"| command | median s | median ratio to srun true (n={args.repeats}) |")
    print("|---|---|---|")
    for name, values in times.items():
        ratios = [v / b for v, b in zip(values, base)]
        print(f"| `{name}` | {statistics.median(values):.3f} | {statistics.median(ratios):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
