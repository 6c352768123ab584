"""A three-task csrun.torch job that fails where ``FAIL=RANK:PHASE:CODE`` says (tests/launch/test_job_failures.py).

Phases: ``before`` (sys.exit before csrun or MPI is imported), ``stream`` (os._exit while the
task's DataLoader makes batch 5: a streamer dies mid-stream, or a lone chief mid-step), ``raise``
and ``exit`` (an uncaught RuntimeError, or sys.exit(CODE), there instead: under mpi4py's runner
both end in MPI_Abort), ``step``
(sys.exit in the chief's loop at step 3), ``atexit`` (os._exit in an exit hook after the job's
work), ``none``. Every task prints ``rank N starting``; the chief ``rank 0 done`` at the end. ``STEP_SLEEP`` seconds between steps (default 0.01).
``SET_ENV=WHEN:NAME=VALUE`` sets a variable in the chief's own environment just before
``initialize`` or ``session`` entry (a script that changes a setting the launcher never saw).
``NODES_TO=DIR``: each task first writes the node Slurm gave it to ``DIR/node.<rank>``.
"""

import atexit
import os
import sys
import time

rank = int(os.environ.get("PMI_RANK", os.environ.get("SLURM_PROCID", "0")))
victim, phase, code = os.environ.get("FAIL", "-1:none:0").split(":")
when, _, assignment = os.environ.get("SET_ENV", "").partition(":")


def set_env(now: str) -> None:
    if when == now and rank == 0:
        name, _, value = assignment.partition("=")
        os.environ[name] = value


if os.environ.get("NODES_TO"):
    with open(os.path.join(os.environ["NODES_TO"], f"node.{rank}"), "w") as f:
        f.write(os.environ.get("SLURMD_NODENAME", ""))
mine = rank == int(victim)
if mine and phase == "before":
    sys.exit(int(code))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import csrun.torch as cbtorch  # noqa: E402


class Data(Dataset):
    def __len__(self) -> int:
        return 4096

    made = 0

    def __getitem__(self, i: int) -> torch.Tensor:
        Data.made += 1
        if mine and Data.made == 5 * 8:  # this task's 5th batch
            if phase == "stream":
                os._exit(int(code))
            if phase == "raise":
                raise RuntimeError("a bug in the input pipeline")
            if phase == "exit":
                sys.exit(int(code))
        return torch.full((4,), float(i))


if mine and phase == "atexit":
    atexit.register(lambda: os._exit(int(code)))
set_env("initialize")
cbtorch.initialize(None)
print(f"rank {rank} starting", flush=True)  # every task (a streamer's body never runs: it ends in Session)
loader = cbtorch.dataloader(DataLoader(Data(), batch_size=8, drop_last=True))
pause = float(os.environ.get("STEP_SLEEP", "0.01"))
set_env("session")
with cbtorch.Session(loader):
    for i, batch in enumerate(loader):
        if mine and phase == "step" and i == 3:
            sys.exit(int(code))
        if i == 1:
            print("STEPPING", flush=True)
        time.sleep(pause)
        if i == 60:
            break
print(f"rank {rank} done", flush=True)
