"""The seed blog's typical training loop, written against csrun.torch as a user writes it.

The model returns logits; the criterion, the backward, the optimizer step and the accuracy
live in the loop; a step closure reads the loss and the accuracy. Usage:

    python typical_loop.py OUT.json [--cs_ip X] [--compile_only|--validate_only] [--model_dir D] [--steps N]

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


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(inputs)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--cs_ip", default=None)
    p.add_argument("--compile_only", action="store_true")
    p.add_argument("--validate_only", action="store_true")
    p.add_argument("--model_dir", default="model_dir")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()

    cbtorch.initialize(args.cs_ip, compile_only=args.compile_only, validate_only=args.validate_only,
                       settings=CompileSettings(mixed_precision=False), model_dir=args.model_dir)
    torch.manual_seed(0)
    model = Classifier()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8 * args.steps, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    dataloader = DataLoader(TensorDataset(x, y), batch_size=8, drop_last=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    model = cbtorch.module(model)
    dataloader = cbtorch.dataloader(dataloader)
    optimizer = cbtorch.optimizer(optimizer)
    loss_fn = nn.CrossEntropyLoss()
    losses: list[float] = []
    accuracies: list[float] = []

    def closure(step: int, loss: torch.Tensor, accuracy: torch.Tensor) -> None:
        losses.append(loss.item())
        accuracies.append(accuracy.item())

    with cbtorch.Session(dataloader, mode="train"):
        for step, (inputs, targets) in enumerate(dataloader):
            optimizer.zero_grad()
            outputs = model(inputs)
            loss = loss_fn(outputs, targets)
            loss.backward()
            optimizer.step()
            accuracy = (outputs.argmax(dim=1) == targets).float().mean()
            cbtorch.add_step_closure(closure, args=(step, loss, accuracy))
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "accuracies": accuracies, "global_step": cbtorch.global_step(),
                   "streamers": cbtorch.num_streamers(),
                   "fc1": model.fc1.weight.detach().flatten().tolist()}, f)


if __name__ == "__main__":
    main()
