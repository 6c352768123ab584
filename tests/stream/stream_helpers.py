"""Helpers for the stream tests: run the test script under mpiexec, compute expected sequences."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).parent / "scripts" / "stream_job.py"
MPIEXEC = Path(sys.executable).parent / "mpiexec"


@dataclass
class Job:
    """What one run left behind."""

    rc: int
    output: str
    seconds: float
    records: dict[int, dict]


def run_job(out: Path, tasks: int, *args: str, env: dict[str, str] | None = None,
            timeout: float = 60) -> Job:
    """Run the stream test script with ``tasks`` tasks (1: plain python, no mpiexec)."""
    cmd = [sys.executable, str(SCRIPT), str(out), *args]
    if tasks > 1:
        cmd = [str(MPIEXEC), "-n", str(tasks), *cmd]
    full_env = {**os.environ, **(env or {})}
    for name in ("PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        full_env.pop(name, None)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
    seconds = time.monotonic() - t0
    records = {}
    if out.exists():
        for f in out.glob("rank*.json"):
            records[int(f.stem[4:])] = json.loads(f.read_text())
    return Job(rc=proc.returncode, output=proc.stdout + proc.stderr, seconds=seconds, records=records)


def expected_sequence(n: int, batch: int, streamers: int, count: int, skip: int = 0) -> list[list[int]]:
    """The chief's batches (sample indices) computed from the sharding rule alone."""
    s = max(streamers, 1)
    shards = [list(range(n))[k::s] for k in range(s)]
    per = len(shards[0]) // batch
    epoch = [shards[k][r * batch:(r + 1) * batch] for r in range(per) for k in range(s)]
    full = epoch * ((skip + count) // len(epoch) + 2)
    return full[skip:skip + count]
