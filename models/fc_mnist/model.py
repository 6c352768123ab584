"""fc_mnist: the legacy fully-connected digits classifier (depth x hidden_size, dropout, activation).

``forward(batch)`` takes ``(images, labels)`` and returns ``{"loss", "accuracy",
"num_samples"}``: the mean cross-entropy (what is trained) and the share of right answers over
the batch's real samples, and their count. A label of -1 marks a padding sample (the eval
loader pads the split to whole batches): it counts in none of them. The runner weights each
eval batch's loss and accuracy by ``num_samples``, so the means are over the whole split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from csrun.run.model_size import MAX_LAYERS, linear_parameters
from csrun.run.params import InputConfig, ModelConfig, doc

PAD_LABEL = -1
"""A padding sample's label (models/fc_mnist/data.py): not scored."""

MAX_SYNTHETIC_SAMPLES = 1 << 22
"""The most synthetic samples (1 GiB of 8x8 float32 images, made in memory)."""

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}


@dataclass(kw_only=True)
class FcMnistConfig(ModelConfig):
    """``model`` for fc_mnist."""

    depth: int = doc(10, "hidden layers", min=1, max=MAX_LAYERS)
    hidden_size: int = doc(50, "units per hidden layer", min=1)
    dropout: float = doc(0.0, "dropout after every hidden layer", min=0, below=1)
    activation_fn: Literal["relu", "gelu", "tanh", "sigmoid"] = doc("relu", "activation of the hidden layers")
    input_size: int = doc(64, "pixels per image (8x8 digits: 64; MNIST: 784)", min=1)
    num_classes: int = doc(10, "output classes", min=2)
    init: Literal["he", "torch"] = doc("he", "weight init: 'he' (Kaiming normal, zero biases: a 10-layer ReLU "
                                             "stack trains with SGD lr 0.001) or 'torch' (nn.Linear's default, "
                                             "which barely trains at depth 10 on the 8x8 digits)")

    def parameter_count(self) -> int:
        """depth hidden layers and the output layer, from the keys alone."""
        hidden = linear_parameters(self.input_size, self.hidden_size)
        hidden += (self.depth - 1) * linear_parameters(self.hidden_size, self.hidden_size)
        return hidden + linear_parameters(self.hidden_size, self.num_classes)


@dataclass(kw_only=True)
class FcMnistInputConfig(InputConfig):
    """``train_input`` / ``eval_input`` for fc_mnist."""

    data_source: Literal["digits", "synthetic"] = doc("digits", "the bundled handwritten digits, or seeded random data")
    synthetic_samples: int = doc(4096, "samples in the synthetic data set", min=1, max=MAX_SYNTHETIC_SAMPLES)


def eval_metrics(means: dict[str, float]) -> dict[str, float]:
    """The eval metrics from the runner's means over the eval batches: ``accuracy``."""
    return {"accuracy": means["accuracy"]}


class FcMnist(nn.Module):
    """depth Linear+activation(+dropout) layers, then a Linear to the classes."""

    def __init__(self, cfg: FcMnistConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = cfg.input_size
        for _ in range(cfg.depth):
            layers += [nn.Linear(width, cfg.hidden_size), ACTIVATIONS[cfg.activation_fn]()]
            if cfg.dropout > 0:
                layers.append(nn.Dropout(cfg.dropout))
            width = cfg.hidden_size
        layers.append(nn.Linear(width, cfg.num_classes))
        self.net = nn.Sequential(*layers)
        if cfg.init == "he":
            for m in self.net:
                if isinstance(m, nn.Linear):
                    nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                    nn.init.zeros_(m.bias)
        self.loss_fn = nn.CrossEntropyLoss(ignore_index=PAD_LABEL)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Loss and accuracy over the batch's real samples (labels >= 0), and their count."""
        images, labels = batch
        logits = self.net(images)
        count = (labels >= 0).sum()  # an integer: exact whatever the compute precision
        right = (logits.argmax(dim=-1) == labels).float()
        return {"loss": self.loss_fn(logits, labels),
                "accuracy": right.sum() / torch.clamp(count, min=1),
                "num_samples": count}
