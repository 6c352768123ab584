"""``torchvision.datasets.MNIST`` over the four uncompressed IDX files in ``<root>/MNIST/raw``."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

_FILES = {True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def _read_idx(path: Path) -> np.ndarray:
    data = path.read_bytes()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


class MNIST(torch.utils.data.Dataset):
    """Images (28x28 uint8 tensors, as a PIL image would convert) and integer labels."""

    def __init__(self, root: str, train: bool = True, download: bool = False,
                 transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[Any], Any] | None = None) -> None:
        raw = Path(root) / "MNIST" / "raw"
        images, labels = _FILES[bool(train)]
        self.data = torch.from_numpy(_read_idx(raw / images).copy())
        self.targets = torch.from_numpy(_read_idx(raw / labels).astype(np.int64))
        self.transform, self.target_transform = transform, target_transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        img: Any = self.data[index]
        target: Any = int(self.targets[index])
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target
