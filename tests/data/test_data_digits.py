"""fc_mnist's bundled digits: loader shapes and ranges, a deterministic split, synthetic data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from csrun.data import DataError, digits_dataset, load_digits, split_digits, synthetic_digits

pytestmark = pytest.mark.timeout(60)

DIGITS = Path(__file__).resolve().parents[2] / "models" / "fc_mnist" / "data" / "digits.csv.gz"


def test_load_digits_shapes_and_ranges() -> None:
    images, labels = load_digits(DIGITS)
    assert images.shape == (1797, 64) and images.dtype == np.float32
    assert labels.shape == (1797,) and labels.dtype == np.int64
    assert images.min() == 0.0 and images.max() == 1.0
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def test_split_is_deterministic_and_disjoint() -> None:
    images, labels = load_digits(DIGITS)
    a, b = split_digits(images, labels, seed=1), split_digits(images, labels, seed=1)
    other = split_digits(images, labels, seed=2)
    assert a.eval_images.shape == (359, 64) and a.train_images.shape == (1438, 64)
    assert np.array_equal(a.eval_images, b.eval_images) and np.array_equal(a.train_labels, b.train_labels)
    assert not np.array_equal(a.eval_images, other.eval_images)
    rows = {r.tobytes() for r in images}
    assert {r.tobytes() for r in a.train_images} | {r.tobytes() for r in a.eval_images} <= rows
    assert len(a.train_labels) + len(a.eval_labels) == len(labels)
    assert set(a.eval_labels.tolist()) == set(range(10))
    with pytest.raises(DataError, match="eval_fraction"):
        split_digits(images, labels, eval_fraction=1.0)


def test_synthetic_digits_are_seeded() -> None:
    x, y = synthetic_digits(50, seed=3)
    assert x.shape == (50, 64) and x.dtype == np.float32 and 0 <= x.min() and x.max() < 1
    assert y.shape == (50,) and y.dtype == np.int64 and 0 <= y.min() and y.max() <= 9
    x2, y2 = synthetic_digits(50, seed=3)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert not np.array_equal(x, synthetic_digits(50, seed=4)[0])
    image, label = digits_dataset(x, y)[7]
    assert image.dtype == torch.float32 and label.dtype == torch.int64


def test_missing_digits_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_digits(tmp_path / "digits.csv.gz")
    bad = tmp_path / "bad.csv"
    bad.write_text("1,2,3\n")
    with pytest.raises(DataError, match="rows of 3 values"):
        load_digits(bad)
