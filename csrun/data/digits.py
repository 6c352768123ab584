"""The handwritten-digits data fc_mnist trains on, and its synthetic stand-in.

The real data is scikit-learn's copy of the UCI "optdigits" test set, bundled as
``models/fc_mnist/data/digits.csv.gz``: 1797 rows of 65 comma-separated integers, 64 pixels
of an 8x8 image (row-major, values 0..16) then the label 0..9. :func:`load_digits` returns
images scaled to 0..1 as float32 ``[N, 64]`` and labels as int64 ``[N]`` (what
``CrossEntropyLoss`` wants). :func:`split_digits` makes a fixed, seeded train/eval split;
:func:`synthetic_digits` makes random data of the same shapes, like the legacy fc_mnist's
synthetic-data option.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from csrun.data.errors import DataError
from csrun.data.order import epoch_order

NUM_FEATURES = 64
"""Pixels per image (8x8)."""
NUM_CLASSES = 10
"""Digits 0..9."""
MAX_PIXEL = 16.0
"""Largest raw pixel value."""


def load_digits(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """``(images float32 [N, 64] in 0..1, labels int64 [N])`` from ``digits.csv.gz`` (or a plain .csv)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"digits file {str(path)!r} does not exist (fc_mnist bundles it as "
                        "models/fc_mnist/data/digits.csv.gz)")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="ascii") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.float64, ndmin=2)
    except (OSError, ValueError, EOFError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read digits file {str(path)!r}: {exc}") from None
    if table.shape[1] != NUM_FEATURES + 1 or table.shape[0] == 0:
        raise DataError(f"digits file {str(path)!r} has rows of {table.shape[1]} values; expected "
                        f"{NUM_FEATURES} pixels and a label")
    images, labels = table[:, :NUM_FEATURES], table[:, NUM_FEATURES]
    if images.min() < 0 or images.max() > MAX_PIXEL or not np.all(np.isin(labels, np.arange(NUM_CLASSES))):
        raise DataError(f"digits file {str(path)!r} holds pixels outside 0..16 or labels outside 0..9")
    return (images / MAX_PIXEL).astype(np.float32), labels.astype(np.int64)


@dataclass(frozen=True, kw_only=True)
class DigitsSplit:
    """A train/eval split of images and labels."""

    train_images: np.ndarray
    """float32 ``[N_train, 64]``."""
    train_labels: np.ndarray
    """int64 ``[N_train]``."""
    eval_images: np.ndarray
    """float32 ``[N_eval, 64]``."""
    eval_labels: np.ndarray
    """int64 ``[N_eval]``."""


def split_digits(images: np.ndarray, labels: np.ndarray, *, eval_fraction: float = 0.2,
                 seed: int = 0) -> DigitsSplit:
    """A fixed split: a seeded permutation (stable across versions); the first ``round(N*eval_fraction)`` rows are eval."""
    if not 0.0 < eval_fraction < 1.0:
        raise DataError(f"eval_fraction must be between 0 and 1, got {eval_fraction!r}")
    if len(images) != len(labels):
        raise DataError(f"{len(images)} images but {len(labels)} labels")
    order = epoch_order(len(images), shuffle=True, shuffle_seed=seed, epoch=0)
    n_eval = int(round(len(images) * eval_fraction))
    ev, tr = np.sort(order[:n_eval]), np.sort(order[n_eval:])
    return DigitsSplit(train_images=images[tr], train_labels=labels[tr],
                       eval_images=images[ev], eval_labels=labels[ev])


def synthetic_digits(num_samples: int, *, seed: int = 0, num_features: int = NUM_FEATURES,
                     num_classes: int = NUM_CLASSES) -> tuple[np.ndarray, np.ndarray]:
    """Random ``(images float32 [N, num_features] in 0..1, labels int64 [N] in 0..num_classes-1)``, seeded."""
    if num_samples < 1:
        raise DataError(f"num_samples must be at least 1, got {num_samples!r}")
    rng = np.random.Generator(np.random.PCG64(seed))
    images = rng.random((num_samples, num_features), dtype=np.float32)
    labels = rng.integers(0, num_classes, size=num_samples, dtype=np.int64)
    return images, labels


def digits_dataset(images: np.ndarray, labels: np.ndarray) -> TensorDataset:
    """A map-style dataset of ``(image, label)`` tensors, for a DataLoader."""
    return TensorDataset(torch.from_numpy(np.ascontiguousarray(images)),
                         torch.from_numpy(np.ascontiguousarray(labels)))
