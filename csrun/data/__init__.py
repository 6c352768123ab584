"""csrun.data: the input-pipeline room — HDF5 processors, the text→HDF5 converter, fc_mnist's digits.

What an input function uses:

* :class:`InputConfig`, the one model of an input section (the runner's params use it too),
  and :class:`HDF5InputConfig`, the same with the HDF5 processor keys
  (``from_params(params["train_input"], "train_input")``), read by :mod:`csrun.typed_config`;
* :func:`hdf5_dataloader` ``(config, shard_index=task_id(), num_shards=num_tasks())``;
* :class:`HDF5ShardDataset` — iterable, shards itself (seeded per-epoch shuffle, equal
  shards, exact resume with ``skip_batches``); :class:`HDF5Dataset` — map-style, every sample;
* :func:`load_digits`, :func:`split_digits`, :func:`synthetic_digits`, :func:`digits_dataset`;
* :func:`epoch_order` and :class:`ShardLayout`, the pure functions behind the order and split.

The converter is ``cs_convert_hdf5`` (:mod:`csrun.cli.cs_convert_hdf5`; the work is in
:mod:`csrun.data.convert`). Formats and ``metadata.json``: :mod:`csrun.data.formats`. Errors are
:class:`DataError` (a :class:`csrun.errors.UserError`); a bad input-section key or value is a
:class:`csrun.errors.ConfigError`. This package imports nothing else from csrun but
:mod:`csrun.errors` and :mod:`csrun.typed_config` (and ``csrun.__version__``, recorded in metadata).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {
    "HDF5InputConfig": "config", "InputConfig": "config", "DigitsSplit": "digits", "digits_dataset": "digits",
    "load_digits": "digits", "split_digits": "digits", "synthetic_digits": "digits",
    "DataError": "errors", "DatasetMetadata": "formats", "read_metadata": "formats",
    "HDF5Dataset": "hdf5_dataset", "HDF5ShardDataset": "hdf5_dataset", "hdf5_dataloader": "loader",
    "ShardLayout": "order", "epoch_order": "order",
}


def __getattr__(name: str) -> Any:
    """Import on first use, so the converter does not pay for importing torch."""
    if name in _WHERE:
        return getattr(import_module(f"csrun.data.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'csrun.data' has no attribute {name!r}")


__all__ = ["DataError", "DatasetMetadata", "DigitsSplit", "HDF5Dataset", "HDF5InputConfig",
           "HDF5ShardDataset", "InputConfig", "ShardLayout", "digits_dataset", "epoch_order", "hdf5_dataloader",
           "load_digits", "read_metadata", "split_digits", "synthetic_digits"]
