"""Building the DataLoader an input function returns, from an :class:`~csrun.data.config.HDF5InputConfig`.

A legacy-style input function::

    def train_input_dataloader(params):
        config = HDF5InputConfig.from_params(params["train_input"], "train_input")
        return hdf5_dataloader(config, shard_index=cbtorch.task_id(), num_shards=cbtorch.num_tasks())

The model zoo's input sections are already :class:`HDF5InputConfig` subclasses (read by the
runner's params), so their input functions hand the section over as it is
(:func:`csrun.run.inputs.hdf5_input_fns`).

The loader batches the shard's samples with ``batch_size`` and ``drop_last_batch``; each
``for`` over it is the next epoch (see :class:`~csrun.data.hdf5_dataset.HDF5ShardDataset`).
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

from csrun.data.config import HDF5InputConfig
from csrun.data.hdf5_dataset import HDF5ShardDataset
from csrun.errors import ConfigError


def hdf5_dataloader(config: HDF5InputConfig, *, shard_index: int = 0, num_shards: int = 1,
                    epoch: int = 0, skip_batches: int = 0, vocab_size: int | None = None,
                    section: str = "input") -> DataLoader:
    """A DataLoader over shard ``shard_index`` of ``num_shards``, starting at epoch ``epoch``.

    ``skip_batches`` is the number of global batches (over all shards, i.e. chief steps since
    the start of ``epoch``) already consumed: each shard skips its part of them without
    reading, so a run resumed at step ``n`` passes ``skip_batches=n``. Use this or the
    streaming layer's own skip, not both. The config is checked first (``section`` names it
    in errors), then the data's metadata against its processor keys and ``vocab_size`` (the
    model's, when given).
    """
    config.check(section)
    if not config.data_dir:
        raise ConfigError(f"{section}.data_dir: empty; give the directory cs_convert_hdf5 wrote")
    dataset = HDF5ShardDataset(config.data_dir, batch_size=config.batch_size, shard_index=shard_index,
                               num_shards=num_shards, shuffle=config.shuffle,
                               shuffle_seed=config.shuffle_seed, drop_last_batch=config.drop_last_batch,
                               epoch=epoch, skip_batches=skip_batches,
                               int_dtype=config.int_dtype)  # type: ignore[arg-type]
    config.check_against(dataset.metadata, vocab_size=vocab_size)
    options: dict[str, Any] = {}
    if config.num_workers > 0:
        options["persistent_workers"] = config.persistent_workers
        if config.prefetch_factor is not None:
            options["prefetch_factor"] = config.prefetch_factor
    return DataLoader(dataset, batch_size=config.batch_size, drop_last=config.drop_last_batch,
                      num_workers=config.num_workers, **options)
