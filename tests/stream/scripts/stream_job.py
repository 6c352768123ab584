"""A user script the stream tests run unchanged: alone (``python stream_job.py OUT ...``) or
under ``mpiexec -n K``. Every sample carries its index, so the chief can record exactly which
samples each batch held. Each task writes ``OUT/rank<R>.json`` with its helper values; the
chief adds the batches it saw, the dtypes the model got, the step-closure log and the stats.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

import csrun.torch as cbtorch


class Indexed(Dataset):
    """Sample i is (index i as int64, a float vector filled with i), or a nested dict of them."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def __len__(self) -> int:
        return self.args.n

    def __getitem__(self, i: int):
        a = self.args
        if i == a.fail_at:
            raise ValueError(f"bad sample {i}")
        if i == a.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if i == a.stall_at:
            time.sleep(3600)
        if a.delay:
            time.sleep(a.delay)
        idx = torch.tensor(i + a.offset, dtype=torch.int64)
        vec = torch.full((a.width,), float(i), dtype=torch.float32)
        if a.nested:
            return {"idx": idx, "pair": (vec, torch.tensor([i, 2 * i], dtype=torch.int64)),
                    "half": [vec[:2].to(torch.bfloat16)]}
        return idx, vec


def _refilling(a: argparse.Namespace):
    """A collate_fn that writes every batch into the same two preallocated tensors."""
    idx, vec = torch.empty(a.batch, dtype=torch.int64), torch.empty(a.batch, a.width)

    def collate(samples):
        torch.stack([s[0] for s in samples], out=idx)
        torch.stack([s[1] for s in samples], out=vec)
        return idx, vec

    return collate


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--n", type=int, default=24)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: epochs)")
    p.add_argument("--skip", type=int, default=0)
    p.add_argument("--width", type=int, default=3)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--nested", action="store_true")
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--prefetch", type=int, default=None)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--fail-at", type=int, default=-1)
    p.add_argument("--kill-at", type=int, default=-1)
    p.add_argument("--stall-at", type=int, default=-1)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--slow", type=float, default=0.0, help="seconds per chief step")
    p.add_argument("--rss", action="store_true", help="sample the chief's VmRSS every step")
    p.add_argument("--chief-fail-at", type=int, default=-1, help="raise in the chief's body at this step")
    p.add_argument("--no-session", action="store_true", help="the chief never opens the Session")
    p.add_argument("--refill", action="store_true", help="a collate_fn that refills the same two tensors")
    a = p.parse_args()

    cbtorch.initialize()
    a.out.mkdir(parents=True, exist_ok=True)
    rank = cbtorch.get_ordinal()
    generator = torch.Generator().manual_seed(1234) if a.shuffle else None
    loader = cbtorch.dataloader(
        DataLoader(Indexed(a), batch_size=a.batch, drop_last=True, shuffle=a.shuffle,
                   generator=generator, num_workers=a.workers, collate_fn=_refilling(a) if a.refill else None),
        prefetch=a.prefetch)
    if a.skip:
        loader.skip(a.skip)
    total = cbtorch.mesh_reduce("ranks", rank, sum)
    cbtorch.rendezvous("before-session")
    record = {
        "rank": rank, "is_master_ordinal": cbtorch.is_master_ordinal(),
        "is_streamer": cbtorch.is_streamer(), "task_id": cbtorch.task_id(),
        "num_tasks": cbtorch.num_tasks(), "num_streamers": cbtorch.num_streamers(),
        "streaming_rank": cbtorch.get_streaming_rank(), "use_cs": cbtorch.use_cs(),
        "rank_sum": total, "len": len(loader), "node": os.environ.get("SLURMD_NODENAME"),
    }
    (a.out / f"rank{rank}.json").write_text(json.dumps(record))

    batches, dtypes, log = [], {}, []
    rss = []
    base_rss = _rss_kb()

    @cbtorch.step_closure
    def second(step: int) -> None:
        log.append(["second", step])

    session = cbtorch.Session(loader, mode="train")
    if a.no_session and cbtorch.is_master_ordinal():
        cbtorch.master_print("chief leaves without a session")
        return 0
    with session:
        step = 0
        for _epoch in range(a.epochs if not a.steps else 10**6):
            for batch in loader:
                if a.nested:
                    idx = batch["idx"]
                    dtypes = {"idx": str(batch["idx"].dtype), "vec": str(batch["pair"][0].dtype),
                              "ints": str(batch["pair"][1].dtype), "half": str(batch["half"][0].dtype)}
                    vec_ok = bool((batch["pair"][0][:, 0] == idx.float() - a.offset).all())
                    pair_ok = bool((batch["pair"][1][:, 1] == 2 * (idx - a.offset)).all())
                    vec_ok = vec_ok and pair_ok
                else:
                    idx, vec = batch
                    dtypes = {"idx": str(idx.dtype), "vec": str(vec.dtype)}
                    vec_ok = bool((vec[:, 0] == idx.float() - a.offset).all())
                batches.append(idx.tolist())
                log.append(["body", step])
                if step == a.chief_fail_at:
                    raise RuntimeError(f"chief fails at step {step}")
                cbtorch.add_step_closure(lambda s: log.append(["first", s]), (step,))
                second(step)
                if not vec_ok:
                    raise SystemExit(f"batch {step}: payload does not match its indices")
                if a.slow:
                    time.sleep(a.slow)
                if a.rss:
                    rss.append(_rss_kb())
                step += 1
                if a.steps and step >= a.steps:
                    break
            log.append(["loop-end", step])
            if a.steps and step >= a.steps:
                break
    record.update(mpi_loaded="mpi4py" in sys.modules, batches=batches, dtypes=dtypes, log=log, stats=session.stats.to_dict(),
                  base_rss_kb=base_rss, rss_kb=rss)
    (a.out / f"rank{rank}.json").write_text(json.dumps(record))
    cbtorch.master_print("chief done")
    return 0


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
