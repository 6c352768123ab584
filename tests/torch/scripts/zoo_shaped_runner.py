"""A runner shaped like the R1.6 Model Zoo's CS runner (written here, not the zoo's code).

Its imports are the zoo's gate (a CPU stub on ImportError, which this script refuses to run
with); it calls ``initialize`` with R1.6's keywords and the zoo's ``host:9000`` cs_ip, shards its
own input with a DistributedSampler over ``num_streamers()`` on streamers, builds
``amp.GradScaler(...)`` from "params" and trains with ``grad_scaler(loss).backward()``,
stops at ``max_steps`` by ``cm.get_run_step()``, saves with ``cm.save(..., master_only=True)``;
on a compile-only run it compiles with ``cbtorch.compile(validate_only=)`` after one step.

argv: OUT_JSON MAX_STEPS [--cs_ip X] [--compile_only] [--validate_only] [--model_dir D].
The chief writes OUT_JSON: the sample indices its steps trained on, the losses, the steps.
"""

import argparse
import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

try:
    import cerebras.framework.torch as cbtorch
    from cerebras.framework.torch import amp
    from cerebras.framework.torch.core import cb_model as cm
    from cerebras.framework.torch.core import modes
    from cerebras.pb.stack.autogen_pb2 import AP_DISABLED  # noqa: F401
except ImportError:
    sys.exit("zoo_shaped_runner: the zoo's gate fell back to its CPU stub")

N = 96
BATCH = 8


class Indexed(Dataset):
    """Sample i: features from i, label i % 3, and i itself (so the chief can tell which arrived)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):  # noqa: ANN204
        g = torch.Generator().manual_seed(i)
        return torch.randn(6, generator=g), torch.tensor(i % 3, dtype=torch.int32), torch.tensor(i)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(6, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.nll_loss(torch.log_softmax(self.fc2(torch.relu(self.fc1(x))), dim=1), y)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("max_steps", type=int)
    parser.add_argument("--cs_ip")
    parser.add_argument("--compile_only", action="store_true", default=None)
    parser.add_argument("--validate_only", action="store_true", default=None)
    parser.add_argument("--model_dir", default="model_dir")
    args = parser.parse_args()
    cs_ip = args.cs_ip if args.cs_ip is None or ":" in args.cs_ip else f"{args.cs_ip}:9000"  # as the zoo does
    cbtorch.initialize(service_workdir=args.model_dir, compile_dir=args.model_dir, cs_ip=cs_ip,
                       compile_only=args.compile_only or args.validate_only, appliance=None, use_cbfloat16=False)
    assert cm.use_cs()
    model = cbtorch.module(Net(), None)
    opt = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    assert isinstance(opt, cbtorch.optim.Optimizer)
    scaler = amp.GradScaler(loss_scale="dynamic", initial_loss_scale=None, steps_per_increase=None,
                            min_loss_scale=None, max_loss_scale=None, max_gradient_norm=1.0, mixed_precision=False)
    sampler = None
    if cm.num_streamers() > 1 and cm.is_streamer():
        sampler = torch.utils.data.distributed.DistributedSampler(
            Indexed(), num_replicas=cm.num_streamers(), rank=cm.get_streaming_rank(), shuffle=False)
    loader = cbtorch.dataloader(DataLoader(Indexed(), batch_size=BATCH, sampler=sampler, drop_last=True))
    seen: list[int] = []
    losses: list[float] = []

    @cm.step_closure
    def keep(loss: torch.Tensor, index: torch.Tensor) -> None:
        losses.append(cm.to_cpu(loss).item())
        seen.extend(cm.to_cpu(index).tolist())

    if args.compile_only or args.validate_only:
        for x, y, _ in loader:
            scaler(model(x, y)).backward()
            opt.step()
            break
        assert cbtorch.compile(fabric_config_file=None, validate_only=bool(args.validate_only)), "Compile failed"
        steps = 0
    else:
        with cbtorch.Session(loader, modes.TRAIN):
            while cm.get_run_step() < args.max_steps:
                for x, y, index in loader:
                    opt.zero_grad()
                    loss = model(x, y)
                    scaler(loss).backward()
                    opt.step()
                    keep(loss, index)
                    if cm.get_run_step() >= args.max_steps:
                        break
        steps = cm.get_run_step()
        cm.save({"model": model.state_dict(), "global_step": steps}, f"{args.model_dir}/checkpoint_{steps}.mdl",
                master_only=True)
    if cm.is_master_ordinal():
        with open(args.out, "w") as f:
            json.dump({"seen": seen, "losses": losses, "steps": steps, "batches_per_epoch": len(loader),
                       "tasks": cm.num_tasks()}, f)


if __name__ == "__main__":
    main()
