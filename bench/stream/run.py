"""Streaming benchmark: csrun's stream against raw MPI and against an in-process DataLoader.

Run (1 chief + 8 streamers; every figure is a ratio measured in the same run)::

    /tmp/probe-venv/bin/mpiexec -n 9 /tmp/probe-venv/bin/python bench/stream/run.py

(any venv with torch, mpi4py and the mpich wheel works: ``mpiexec -n 9 python bench/stream/run.py``;
with fewer tasks the streamer counts above the available ones are left out).

What it measures, on rank 0 (the chief), with the protocol layer (:mod:`csrun.stream`)
used directly so that each part can pick its streamers:

a. Large batches (4, 16, 64 MB, one leaf) from one streamer: csrun's streaming throughput
   with a no-op consumer, as a ratio of raw mpi4py ``Send``/``Irecv`` bandwidth of the same
   buffers between the same two ranks (target >= 0.85); five paired trials, the median
   pair is shown.
b. An input pipeline costing a fixed time per batch (``time.sleep``): batches/s with 1, 2,
   4 and 8 streamers, relative to 1 streamer (target >= 0.9 N).
c. The same pipeline through ``torch.utils.data.DataLoader(num_workers=N)`` in one process:
   ratio csrun(N streamers) / DataLoader(N workers).
d. The chief's peak RSS growth with a slow consumer (16 MB batches, 2 streamers, prefetch
   4), against the ring's size and the total data streamed.

Idle ranks wait in a sleeping ``Ibarrier`` loop so they leave the cores to the others.
Environment: ``BENCH_PIPELINE_MS`` (per-batch cost in part b/c, default 20),
``BENCH_SECONDS`` (measuring time per point in b/c, default 2), ``BENCH_PARTS`` (which
parts to run, default ``abcd``; c needs b).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from mpi4py import MPI
from torch.utils.data import DataLoader, Dataset

warnings.filterwarnings("ignore", message="This DataLoader will create")

from csrun.stream.receiver import Receiver
from csrun.stream.sender import run_streamer
from csrun.stream.source import EPOCH_END

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
PIPELINE_S = float(os.environ.get("BENCH_PIPELINE_MS", "20")) / 1000
SECONDS = float(os.environ.get("BENCH_SECONDS", "2"))
PARTS = os.environ.get("BENCH_PARTS", "abcd")


def quiet_barrier() -> None:
    """A barrier that sleeps while it waits (MPICH's Barrier spins)."""
    req = COMM.Ibarrier()
    while not req.Test():
        time.sleep(0.01)


def bcast_int(value: int) -> int:
    buf = np.array([value], dtype=np.int64)
    req = COMM.Ibcast(buf, root=0)
    while not req.Test():
        time.sleep(0.001)
    return int(buf[0])


class Repeat:
    """A source that yields the same batch forever (epochs of ``per_epoch`` batches)."""

    def __init__(self, batch: Any, per_epoch: int = 1000, cost_s: float = 0.0) -> None:
        self.batch, self.per_epoch, self.cost_s = batch, per_epoch, cost_s

    def batches_per_epoch(self) -> int:
        return self.per_epoch

    def stream(self, skip: int) -> Iterator[Any]:
        while True:
            for _ in range(self.per_epoch):
                if self.cost_s:
                    time.sleep(self.cost_s)
                yield self.batch
            yield EPOCH_END


class Costly(Dataset):
    """Each item is a whole batch that takes ``PIPELINE_S`` to produce."""

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(PIPELINE_S)
        return torch.full((64, 256), float(i))


class LoaderSource:
    """A DataLoader (no workers) over :class:`Costly`, as a stream source."""

    def __init__(self) -> None:
        self.loader = DataLoader(Costly(), batch_size=None, num_workers=0)

    def batches_per_epoch(self) -> None:
        return None

    def stream(self, skip: int) -> Iterator[Any]:
        while True:
            yield from self.loader


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# -- the parts ---------------------------------------------------------------------------------

def raw_bandwidth(batch: torch.Tensor, reps: int, slots: int) -> float:
    """Bytes/s of rank 1 -> rank 0 ``Send``/``Irecv`` of ``batch``'s memory.

    The same buffers as csrun's: the streamer's tensor on the sending side; on the chief,
    ``slots`` receive buffers allocated the way csrun allocates its ring (numpy memory),
    used in turn as csrun's ring and pool use theirs (one buffer would stay cache-hot).
    """
    nbytes = batch.numel() * batch.element_size()
    if RANK == 0:
        bufs = [np.empty(nbytes, dtype=np.uint8) for _ in range(slots)]
    else:
        bufs = [batch.reshape(-1).view(torch.uint8).numpy()]
    quiet_barrier()
    if RANK == 0:
        for buf in bufs:  # touch the pages first
            COMM.Recv([buf, MPI.BYTE], source=1, tag=99)
        t0 = time.perf_counter()
        for i in range(reps):
            req = COMM.Irecv([bufs[i % slots], MPI.BYTE], source=1, tag=99)
            while not req.Test():
                pass
        rate = reps * nbytes / (time.perf_counter() - t0)
    elif RANK == 1:
        for _ in range(reps + slots):
            COMM.Send([bufs[0], MPI.BYTE], dest=0, tag=99)
        rate = 0.0
    else:
        rate = 0.0
    quiet_barrier()
    return rate


def stream_rate(streamers: int, source: Any, *, count: int | None = None, seconds: float | None = None,
                prefetch: int = 4, consumer_s: float = 0.0, sample_rss: bool = False) -> dict[str, float]:
    """Batches/s (and bytes/s) the chief receives from ranks 1..streamers; other ranks idle."""
    quiet_barrier()
    out: dict[str, float] = {}
    if RANK == 0:
        rec = Receiver(COMM, list(range(1, streamers + 1)), prefetch=prefetch, timeout=120)
        base = rss_kb()
        rec.start()
        for _ in range(prefetch + 2):  # warm up: the ring's pages touched, the pool in use
            item = rec.next()
        nbytes = rec.schema.nbytes
        del item
        t0 = time.perf_counter()
        n, peak = 0, rss_kb()
        while True:
            item = rec.next()
            if item is EPOCH_END:
                continue
            n += 1
            if consumer_s:
                time.sleep(consumer_s)
            if sample_rss:
                peak = max(peak, rss_kb())
            del item
            if count is not None and n >= count:
                break
            if seconds is not None and time.perf_counter() - t0 >= seconds:
                break
        dt = time.perf_counter() - t0
        rec.stop()
        out = {"batches_per_s": n / dt, "bytes_per_s": n * nbytes / dt, "batches": n,
               "rss_growth_mb": (peak - base) / 1024, "batch_mb": nbytes / 2**20}
    elif RANK <= streamers:
        run_streamer(COMM, source, node=MPI.Get_processor_name())
    quiet_barrier()
    return out


def dataloader_rate(workers: int, seconds: float) -> float:
    """Batches/s of DataLoader(num_workers=workers) over :class:`Costly` in this process."""
    loader = DataLoader(Costly(), batch_size=None, num_workers=workers, prefetch_factor=4)
    it = iter(loader)
    next(it)
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        next(it)
        n += 1
    rate = n / (time.perf_counter() - t0)
    del it
    return rate


def main() -> int:
    if SIZE < 2:
        print("run under mpiexec with at least 2 tasks (see the docstring)", file=sys.stderr)
        return 2

    # a. large batches vs raw MPI
    large = []
    for mb in (4, 16, 64) if "a" in PARTS else ():
        nbytes = mb << 20
        reps = max(32, 2048 // mb)
        batch = torch.ones(nbytes, dtype=torch.uint8)
        trials = []
        for _trial in range(5):  # paired trials, back to back: the machine may be shared
            raw = raw_bandwidth(batch, reps, slots=4 + 2)
            got = stream_rate(1, Repeat(batch), count=reps).get("bytes_per_s", 0.0)
            trials.append((got / raw if raw else 0.0, raw, got))
        if RANK == 0:
            ratio, raw, got = sorted(trials)[len(trials) // 2]  # the median pair
            large.append((mb, raw, got))

    # b/c. costly pipeline: csrun with N streamers, DataLoader with N workers
    counts = [n for n in (1, 2, 4, 8) if n < SIZE] if "b" in PARTS else []
    scaling = []
    for n in counts:
        got = stream_rate(n, LoaderSource(), seconds=SECONDS)
        peer = 0.0
        quiet_barrier()
        if RANK == 0:
            peer = dataloader_rate(n, SECONDS) if "c" in PARTS else float("nan")
            scaling.append((n, got["batches_per_s"], peer))
        quiet_barrier()

    # d. slow consumer: the chief's memory
    streamers = min(2, SIZE - 1)
    batch16 = torch.ones(16 << 20, dtype=torch.uint8)
    mem = (stream_rate(streamers, Repeat(batch16), count=60, prefetch=4, consumer_s=0.02, sample_rss=True)
           if "d" in PARTS else {})

    if RANK == 0:
        print(f"## csrun stream benchmark ({SIZE} tasks, {os.cpu_count()} cores, "
              f"pipeline {PIPELINE_S * 1000:g} ms/batch)\n")
        print("| part | setting | csrun | reference | ratio | target |")
        print("|---|---|---|---|---|---|")
        for mb, raw, got in large:
            print(f"| a. large batches | {mb} MB, 1 streamer | {got / 1e9:.2f} GB/s | raw MPI "
                  f"{raw / 1e9:.2f} GB/s | {got / raw:.2f} | >= 0.85 |")
        base = scaling[0][1] if scaling else 1.0
        for n, rate, _peer in scaling:
            print(f"| b. scaling | {n} streamer(s) | {rate:.1f} batch/s | 1 streamer {base:.1f} batch/s "
                  f"| {rate / base:.2f} (= {rate / base / n:.2f} N) | >= 0.9 N |")
        for n, rate, peer in scaling:
            print(f"| c. vs DataLoader | {n} streamer(s) / num_workers={n} | {rate:.1f} batch/s | "
                  f"{peer:.1f} batch/s | {rate / peer:.2f} | - |")
        if not mem:
            return 0
        ring = 4 * streamers * mem["batch_mb"]
        print(f"| d. chief memory | slow consumer, {streamers} streamers, prefetch 4, "
              f"{mem['batch_mb']:.0f} MB batches, {int(mem['batches'])} batches "
              f"({int(mem['batches'] * mem['batch_mb'])} MB) | peak RSS growth "
              f"{mem['rss_growth_mb']:.0f} MB | ring {ring:.0f} MB | "
              f"{mem['rss_growth_mb'] / ring:.2f} of ring | bounded |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
