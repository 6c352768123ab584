"""Input helpers for the models' input functions: whole eval splits, and HDF5 input functions.

**Whole eval splits.** The system needs every batch whole (``drop_last=True``), so a split
whose size is not a multiple of ``num_streamers * batch_size`` loses its remainder. An eval
input function keeps it with :func:`pad_to_whole_batches`: the split followed by padding
samples up to whole batches on every streamer. The model then marks the padding (e.g. a label
of -1), averages its outputs over the batch's real samples only and returns their count as
``"num_samples"``: the runner weights each batch's outputs by it and reports the samples
scored (see :mod:`csrun.run`).

**HDF5.** For models whose data is HDF5 written by ``cs_convert_hdf5``.

A model's input section is a subclass of :class:`~csrun.data.HDF5InputConfig` (the one model
of an input section, shared with the data loader), so the section the runner read is handed
to :func:`~csrun.data.hdf5_dataloader` as it is: :func:`hdf5_input_fns` makes the runner's
``train_input_fn`` and ``eval_input_fn`` from it. Each reads its section of the params, puts
the model's bundled data in place of ``data_dir: ""`` (:func:`with_data_dir`), checks the
model's ``vocab_size`` against the data, and returns this streamer's shard
(``cbtorch.task_id()`` of ``cbtorch.num_tasks()``; 0 of 1 on a lone chief).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, TypeVar

from torch.utils.data import DataLoader, Dataset

from csrun.data import HDF5InputConfig, hdf5_dataloader
from csrun.typed_config import ConfigError

InputFn = Callable[[Any], DataLoader]
SectionT = TypeVar("SectionT", bound=HDF5InputConfig)


class PaddedDataset(Dataset):
    """``dataset``'s samples, then ``pad`` (one padding sample) up to ``total`` samples."""

    def __init__(self, dataset: Any, total: int, pad: Any) -> None:
        self.dataset, self.total, self.pad = dataset, total, pad
        self.real = len(dataset)
        """Samples of the split (the rest are padding)."""

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, index: int) -> Any:
        if index < 0:
            index += self.total
        if not 0 <= index < self.total:
            raise IndexError(f"index {index} out of range for {self.total} samples")
        return self.dataset[index] if index < self.real else self.pad


def pad_to_whole_batches(dataset: Any, batch_size: int, num_streamers: int, pad: Any) -> PaddedDataset:
    """``dataset`` padded with ``pad`` to a multiple of ``max(num_streamers, 1) * batch_size``
    samples, so that no sample is dropped and every streamer streams the same whole batches
    (unshuffled: the padding is the last samples)."""
    unit = max(num_streamers, 1) * batch_size
    return PaddedDataset(dataset, -(-len(dataset) // unit) * unit, pad)


def with_data_dir(cfg: SectionT, default_data_dir: str | Path) -> SectionT:
    """``cfg``, or a copy whose empty ``data_dir`` is ``default_data_dir`` (a model's bundled data)."""
    return cfg if cfg.data_dir else dataclasses.replace(cfg, data_dir=str(default_data_dir))


def hdf5_input_fns(config_type: type[HDF5InputConfig], model_name: str,
                   default_data_dir: str | Path) -> tuple[InputFn, InputFn]:
    """``(train_input_fn, eval_input_fn)`` for sections of ``config_type``.

    ``model_name`` appears in the error for a section of another type; ``default_data_dir`` is
    read when a section's ``data_dir`` is empty.
    """

    def section_loader(section: str) -> InputFn:
        def input_fn(params: Any) -> DataLoader:
            cfg = getattr(params, section)
            if not isinstance(cfg, config_type):
                raise ConfigError(f"{section}: needs a {model_name} input section, got {type(cfg).__name__}")
            import csrun.torch as cbtorch  # here: building an input config needs no torch API

            return hdf5_dataloader(with_data_dir(cfg, default_data_dir), section=section,
                                   vocab_size=getattr(params.model, "vocab_size", None),
                                   shard_index=cbtorch.task_id(), num_shards=cbtorch.num_tasks())

        input_fn.__doc__ = f"The runner's input function: this streamer's shard of ``params.{section}``."
        return input_fn

    return section_loader("train_input"), section_loader("eval_input")
