"""A user script written against csrun.torch: trains a small MLP, writes the chief's losses.

Usage: python train_mlp.py OUT.json [--cs_ip X] [--compile_only|--validate_only]
       [--model_dir D] [--steps N] [--item_in_forward]
Every task runs it; streamers stream their shard and exit 0 inside the Session.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import csrun.torch as cbtorch
from csrun.compiler import CompileSettings


class MLP(nn.Module):
    def __init__(self, item_in_forward: bool) -> None:
        super().__init__()
        self.l1 = nn.Linear(6, 16)
        self.l2 = nn.Linear(16, 3)
        self.item_in_forward = item_in_forward

    def forward(self, batch):
        x, y = batch
        loss = nn.functional.cross_entropy(self.l2(torch.tanh(self.l1(x))), y)
        if self.item_in_forward:
            print("loss is", loss.item())  # ITEM-LINE: not allowed inside the step
        return loss


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--cs_ip", default=None)
    p.add_argument("--compile_only", action="store_true")
    p.add_argument("--validate_only", action="store_true")
    p.add_argument("--model_dir", default="model_dir")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--item_in_forward", action="store_true")
    args = p.parse_args()
    settings = CompileSettings(mixed_precision=False, learning_rate=0.1)
    cbtorch.initialize(args.cs_ip, compile_only=args.compile_only, validate_only=args.validate_only,
                       settings=settings, model_dir=args.model_dir)
    torch.manual_seed(0)
    model = cbtorch.module(MLP(args.item_in_forward))
    opt = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(192, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    loader = cbtorch.dataloader(DataLoader(TensorDataset(x, y), batch_size=8, drop_last=True))
    losses: list[float] = []

    @cbtorch.step_closure
    def record(loss: torch.Tensor) -> None:
        losses.append(float(loss.detach()))

    with cbtorch.Session(loader, report=False):
        n = 0
        while n < args.steps:
            for batch in loader:
                opt.zero_grad()
                loss = model(batch)
                loss.backward()
                opt.step()
                record(loss)
                n += 1
                if n == args.steps:
                    break
    info = cbtorch.compile_info()
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "global_step": cbtorch.global_step(),
                   "compile_time": info.compile_time if info else None,
                   "streamers": cbtorch.num_streamers()}, f)


if __name__ == "__main__":
    main()
