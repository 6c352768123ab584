"""A small classifier with the zoo's habits: it checks its inputs' dtypes, and updates an
``AccuracyMetric`` inside ``forward`` when it is not training."""

from __future__ import annotations

import torch

import cerebras.pytorch as cstorch
from cerebras.pytorch.metrics import AccuracyMetric
from cerebras.pytorch.utils.kernel import kernel_annotater


class MiniModel(torch.nn.Module):
    """Two linear layers and NLLLoss; labels are int32 on the CS path (as the zoo's)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 16)
        self.fc2 = torch.nn.Linear(16, 3)
        self.loss_fn = torch.nn.NLLLoss()
        self.accuracy = AccuracyMetric(name="eval/accuracy")
        self.matmul = kernel_annotater(None)(torch.matmul)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        want = torch.int32 if cstorch.use_cs() else torch.int64
        assert batch["label"].dtype == want, f"labels must be {want}, got {batch['label'].dtype}"
        logits = self.fc2(torch.relu(self.fc1(batch["x"])))
        if not self.training:
            self.accuracy(labels=batch["label"].clone(), predictions=logits.argmax(-1).int())
        return self.loss_fn(torch.log_softmax(logits, dim=1), batch["label"])
