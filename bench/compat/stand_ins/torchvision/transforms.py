"""``torchvision.transforms``: Compose, ToTensor (uint8 HxW -> float 1xHxW in [0, 1]), Normalize, Lambda."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch


class Compose:
    """Apply the transforms in order."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x


class ToTensor:
    """A uint8 image (HxW or HxWxC) as a float CxHxW tensor scaled to [0, 1]."""

    def __call__(self, img: Any) -> torch.Tensor:
        t = torch.as_tensor(img)
        if t.dim() == 2:
            t = t.unsqueeze(0)
        elif t.dim() == 3:
            t = t.permute(2, 0, 1)
        return t.to(torch.float32).div(255)


class Normalize:
    """``(x - mean) / std`` per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class Lambda:
    """Apply a function."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, x: Any) -> Any:
        return self.fn(x)
