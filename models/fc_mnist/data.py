"""fc_mnist input functions: the bundled 8x8 digits (or seeded synthetic data) as DataLoaders.

The digits are split once, deterministically (``split_digits``, seed 0: 1438 train / 359
eval). ``cbtorch.dataloader`` refuses uneven shards, so every streamer must stream the same
number of whole batches: the train loader keeps the longest prefix of its split that divides
evenly into ``num_streamers * batch_size`` samples; the eval loader keeps the whole split and
pads it up to whole batches with samples labelled ``PAD_LABEL`` (-1), which the model leaves
out of its loss and accuracy (:func:`csrun.run.inputs.pad_to_whole_batches`). Shuffling uses a generator seeded
from ``shuffle_seed``, so every task draws the same order and a resumed run sees the same
batches as an uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import DataLoader, Subset

import csrun.torch as cbtorch
from csrun.data import digits_dataset, load_digits, split_digits, synthetic_digits
from csrun.run.inputs import pad_to_whole_batches
from csrun.run.params import Params
from model import FcMnistInputConfig

DIGITS = Path(__file__).resolve().parent / "data" / "digits.csv.gz"
"""The bundled data (models/fc_mnist/data/README.md)."""
EVAL_FRACTION = 0.2
SPLIT_SEED = 0
PAD_LABEL = -1
"""The label of the eval loader's padding samples (the model scores only labels >= 0)."""


def _dataset(cfg: FcMnistInputConfig, train: bool) -> torch.utils.data.Dataset:
    if cfg.data_source == "synthetic":
        images, labels = synthetic_digits(cfg.synthetic_samples, seed=cfg.shuffle_seed + (0 if train else 1))
        return digits_dataset(images, labels)
    path = Path(cfg.data_dir) / "digits.csv.gz" if cfg.data_dir else DIGITS
    split = split_digits(*load_digits(path), eval_fraction=EVAL_FRACTION, seed=SPLIT_SEED)
    if train:
        return digits_dataset(split.train_images, split.train_labels)
    return digits_dataset(split.eval_images, split.eval_labels)


def _loader(cfg: FcMnistInputConfig, train: bool) -> DataLoader:
    dataset = _dataset(cfg, train)
    if not train:  # eval scores the whole split: padded up to whole batches on every streamer
        image, label = dataset[0]
        pad = (torch.zeros_like(image), torch.tensor(PAD_LABEL, dtype=label.dtype))
        dataset = pad_to_whole_batches(dataset, cfg.batch_size, cbtorch.num_streamers(), pad)
    unit = max(cbtorch.num_streamers(), 1) * cfg.batch_size
    keep = len(dataset) // unit * unit
    if keep == 0:
        from csrun.errors import UserError

        raise UserError(f"{'train' if train else 'eval'}_input.batch_size {cfg.batch_size}: the {len(dataset)} "
                        f"samples hold no whole batch per streamer ({max(cbtorch.num_streamers(), 1)} streamer(s))")
    generator = torch.Generator().manual_seed(cfg.shuffle_seed) if cfg.shuffle else None
    return DataLoader(Subset(dataset, range(keep)), batch_size=cfg.batch_size, shuffle=cfg.shuffle,
                      generator=generator, drop_last=True, num_workers=cfg.num_workers,
                      prefetch_factor=cfg.prefetch_factor, persistent_workers=cfg.persistent_workers)


def train_input_fn(params: Params) -> DataLoader:
    """The train loader (``params.train_input``)."""
    return _loader(params.train_input, train=True)  # type: ignore[arg-type]


def eval_input_fn(params: Params) -> DataLoader:
    """The eval loader (``params.eval_input``)."""
    return _loader(params.eval_input, train=False)  # type: ignore[arg-type]
