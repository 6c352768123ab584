"""The seed blog's typical loop with the R1.x imports as written (tests/torch/test_legacy_surface.py)."""

import torch
import cerebras.framework.torch as cbtorch
import cerebras.framework.torch.core.cb_model as cm
from torch.utils.data import DataLoader, TensorDataset

cbtorch.initialize()
torch.manual_seed(0)
model = cbtorch.module(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)))
optimizer = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
loss_fn = torch.nn.CrossEntropyLoss()
g = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(256, 4, generator=g), torch.randint(0, 3, (256,), generator=g))
dataloader = cbtorch.dataloader(DataLoader(data, batch_size=16, drop_last=True))
losses = []

def closure(step, loss):
    losses.append(loss.item())

with cbtorch.Session(dataloader, mode="train"):
    for step, (inputs, targets) in enumerate(dataloader):
        optimizer.zero_grad()
        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
        loss.backward()
        optimizer.step()
        cm.add_step_closure(closure, args=(step, loss))
if cm.is_master_ordinal():
    print("LOSSES", " ".join(f"{x:.7f}" for x in losses))
