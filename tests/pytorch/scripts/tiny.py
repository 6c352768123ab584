"""The small model and data that complete the slides' 2.x scripts (imported by them and by the tests)."""

from __future__ import annotations

import torch

BATCH = 8
SAMPLES = 240  # 30 steps of 8


class Model(torch.nn.Module):
    """Two linear layers; log-probabilities out (the slides use NLLLoss)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.fc2(torch.relu(self.fc1(x))), dim=-1)


def dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=g)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    return torch.utils.data.TensorDataset(x, y)


def get_train_dataloader(batch_size: int = BATCH) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset(), batch_size=batch_size, drop_last=True)


def write_losses(path: str, losses: list[float]) -> None:
    with open(path, "w") as f:
        f.write("".join(f"{v!r}\n" for v in losses))
