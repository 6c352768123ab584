"""MPICH network modules under ``srun --mpi=pmi2``: the launchers' OFI/tcp default against UCX.

csrun's Slurm launches set ``MPIR_CVAR_CH4_NETMOD=ofi`` and ``FI_PROVIDER=tcp`` (see
:mod:`csrun.launch.environment` for why UCX is unsafe with the mpich wheel under Slurm's
PMI). This measures what that choice costs: part a of ``bench/stream/run.py`` (csrun's
stream and raw MPI, one streamer, 4/16/64 MB batches) between two tasks on two Slurm nodes,
run alternately with each netmod, and prints the median of the per-round ratios
OFI / UCX for each batch size. UCX runs twice: with ``self,tcp`` (what crosses a real
network) and with ``self,sm,tcp`` (UCX finds the other "node" on this same host and uses
shared memory, which a real cluster cannot).

Run with the local cluster up (``slurm/local-cluster start``; ``SLURM_CONF`` exported)::

    .venv/bin/python bench/stream/netmod.py --rounds 3

Options: ``--rounds N`` (alternating pairs, default 3), ``--python PATH`` (default this one).
On one machine the "nodes" share the loopback device, so this compares the netmods' software
paths, not a network.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {
    "ofi/tcp": {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"},
    "ucx self,tcp": {"MPIR_CVAR_CH4_NETMOD": "ucx", "UCX_TLS": "self,tcp"},
    "ucx self,sm,tcp": {"MPIR_CVAR_CH4_NETMOD": "ucx", "UCX_TLS": "self,sm,tcp"},
}
BASELINE = "ofi/tcp"
ROW = re.compile(r"\| a\. large batches \| (\d+) MB, 1 streamer \| ([\d.]+) GB/s \| raw MPI ([\d.]+) GB/s")


def run_once(python: str, netmod: dict[str, str]) -> dict[int, tuple[float, float]] | None:
    """One srun of part a; {MB: (csrun GB/s, raw GB/s)}, or None if MPI_Init failed."""
    env = {k: v for k, v in os.environ.items() if k not in ("MPIR_CVAR_CH4_NETMOD", "FI_PROVIDER", "UCX_TLS")}
    env.update(netmod, BENCH_PARTS="a", PYTHONPATH=str(ROOT))
    cmd = ["srun", "--mpi=pmi2", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--exclusive",
           python, str(ROOT / "bench/stream/run.py")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    rows = {int(m[1]): (float(m[2]), float(m[3])) for m in ROW.finditer(done.stdout)}
    if done.returncode != 0 or not rows:
        print(f"  {netmod}: srun exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    results: dict[str, list[dict[int, tuple[float, float]]]] = {name: [] for name in CONFIGS}
    failures = {name: 0 for name in CONFIGS}
    for _ in range(args.rounds):
        for name, netmod in CONFIGS.items():
            rows = run_once(args.python, netmod)
            if rows is None:
                failures[name] += 1
            else:
                results[name].append(rows)
    rounds = [dict(zip(CONFIGS, group)) for group in zip(*(results[name] for name in CONFIGS))]
    if not rounds:
        print("no round where every netmod ran", file=sys.stderr)
        return 1
    others = [name for name in CONFIGS if name != BASELINE]
    print(f"## netmods under srun --mpi=pmi2, 2 nodes, csrun stream part a ({len(rounds)} complete rounds; "
          f"failed runs: {', '.join(f'{n} {failures[n]}' for n in CONFIGS)})")
    print("| batch | " + " | ".join(f"csrun {n} GB/s" for n in CONFIGS) + " | "
          + " | ".join(f"median ratio {BASELINE} / {n}" for n in others) + " |")
    print("|---" * (1 + len(CONFIGS) + len(others)) + "|")
    for mb in sorted(rounds[0][BASELINE]):
        speeds = [f"{statistics.median(r[n][mb][0] for r in rounds):.2f}" for n in CONFIGS]
        ratios = [f"{statistics.median(r[BASELINE][mb][0] / r[n][mb][0] for r in rounds):.2f}" for n in others]
        print(f"| {mb} MB | " + " | ".join(speeds) + " | " + " | ".join(ratios) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
