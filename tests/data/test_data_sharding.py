"""The streamer split: equal disjoint shards, seeded per-epoch shuffle, exact resume, workers."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch

from csrun.data import (DataError, HDF5Dataset, HDF5InputConfig, HDF5ShardDataset, ShardLayout,
                        epoch_order, hdf5_dataloader)
from csrun.errors import ConfigError

pytestmark = pytest.mark.timeout(60)

N = 103  # samples in the id data set: a prime, so every split has a remainder


def _ids(loader) -> list[list[int]]:
    """The batches of one pass, as lists of sample ids."""
    return [batch["input_ids"][:, 0].tolist() for batch in loader]


def _loader(data: Path, shard: int, shards: int, **kw) -> torch.utils.data.DataLoader:
    batch = kw.pop("batch_size", 4)
    drop = kw.get("drop_last_batch", True)
    workers = kw.pop("num_workers", 0)
    persistent = kw.pop("persistent_workers", False)
    ds = HDF5ShardDataset(data, batch_size=batch, shard_index=shard, num_shards=shards, **kw)
    return torch.utils.data.DataLoader(ds, batch_size=batch, drop_last=drop, num_workers=workers,
                                       persistent_workers=persistent)


def _chief_sequence(per_shard: list[list[list[int]]]) -> list[list[int]]:
    """Batches in the order the chief receives them: round-robin over the streamers."""
    return [b for round_ in zip(*per_shard) for b in round_]


def test_epoch_order_is_pinned_and_a_permutation() -> None:
    # Golden values: the order must not change across machines or library versions.
    assert epoch_order(10, shuffle=True, shuffle_seed=1, epoch=0).tolist() == [3, 5, 2, 4, 1, 9, 0, 6, 8, 7]
    assert epoch_order(10, shuffle=True, shuffle_seed=1, epoch=1).tolist() == [3, 6, 9, 8, 0, 1, 5, 7, 4, 2]
    assert epoch_order(10, shuffle=True, shuffle_seed=-5, epoch=3).tolist() == [8, 2, 7, 5, 3, 6, 1, 9, 4, 0]
    assert epoch_order(7, shuffle=False, shuffle_seed=1, epoch=4).tolist() == list(range(7))
    assert sorted(epoch_order(1000, shuffle=True, shuffle_seed=9, epoch=2).tolist()) == list(range(1000))


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_shards_are_equal_disjoint_and_cover_the_expected_set(ids_dir: Callable[[int], Path], shards: int,
                                                              drop_last: bool) -> None:
    data = ids_dir(N)
    per_shard = [_ids(_loader(data, k, shards, shuffle=True, shuffle_seed=5, drop_last_batch=drop_last))
                 for k in range(shards)]
    flat = [sorted(i for b in batches for i in b) for batches in per_shard]
    layout = ShardLayout(num_samples=N, batch_size=4, num_shards=shards, drop_last_batch=drop_last)
    assert all(len(f) == layout.samples_per_shard for f in flat)
    assert all(len(batches) == layout.batches_per_shard for batches in per_shard)
    every = [i for f in flat for i in f]
    assert len(every) == len(set(every)) == N - layout.dropped_samples
    order = epoch_order(N, shuffle=True, shuffle_seed=5, epoch=0)
    assert set(every) == set(order[:len(every)].tolist())
    # the chief reads the epoch order from its start, whatever the number of streamers
    chief = [i for b in _chief_sequence(per_shard) for i in b]
    assert chief == order[:len(every)].tolist()
    if drop_last:
        assert layout.dropped_samples == N - N // (4 * shards) * 4 * shards
        assert all(len(b) == 4 for batches in per_shard for b in batches)


def test_shuffle_is_reproducible_and_seeded(ids_dir: Callable[[int], Path]) -> None:
    data = ids_dir(N)
    one = _ids(_loader(data, 1, 2, shuffle_seed=11))
    assert one == _ids(_loader(data, 1, 2, shuffle_seed=11))
    assert one != _ids(_loader(data, 1, 2, shuffle_seed=12))
    plain = [i for b in _ids(_loader(data, 0, 1, shuffle=False)) for i in b]
    assert plain == list(range(100))


def test_each_pass_is_the_next_epoch(ids_dir: Callable[[int], Path]) -> None:
    data = ids_dir(N)
    loader = _loader(data, 0, 2, shuffle_seed=3)
    first, second, third = _ids(loader), _ids(loader), _ids(loader)
    assert first != second != third
    assert sorted(map(sorted, first)) != sorted(map(sorted, second))  # a new permutation, not a reordering
    assert second == _ids(_loader(data, 0, 2, shuffle_seed=3, epoch=1))
    assert third == _ids(_loader(data, 0, 2, shuffle_seed=3, epoch=2))
    loader.dataset.set_epoch(1)
    assert _ids(loader) == second


@pytest.mark.parametrize("skip", [5, 24, 35])
def test_skip_batches_resumes_with_the_same_tail(ids_dir: Callable[[int], Path], skip: int) -> None:
    data = ids_dir(N)
    shards = 2
    full = []
    loaders = [_loader(data, k, shards, shuffle_seed=8) for k in range(shards)]
    for _ in range(3):  # three epochs of the chief's sequence (the resumed run covers two)
        full += _chief_sequence([_ids(ld) for ld in loaders])
    resumed_loaders = [_loader(data, k, shards, shuffle_seed=8, skip_batches=skip) for k in range(shards)]
    per_epoch = ShardLayout(num_samples=N, batch_size=4, num_shards=shards).global_batches_per_epoch
    assert per_epoch == 24
    first = [_ids(ld) for ld in resumed_loaders]  # the rest of the epoch the skip lands in
    # the chief's round-robin goes on where it stopped: at streamer skip % S
    turn = [(skip % shards + t) % shards for t in range(shards)]
    resumed = [first[s][r] for r in range(max(map(len, first))) for s in turn if r < len(first[s])]
    resumed += _chief_sequence([_ids(ld) for ld in resumed_loaders])
    start = skip % per_epoch + (skip // per_epoch) * per_epoch
    assert resumed == full[start:start + len(resumed)]
    assert len(resumed) == per_epoch - skip % per_epoch + per_epoch
    # the streaming layer's per-streamer skip lands on the same batches
    for k in range(shards):
        local = _loader(data, k, shards, shuffle_seed=8)
        local.dataset.skip_shard_batches(skip // shards + (1 if k < skip % shards else 0))
        assert _ids(local) == first[k]


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_do_not_change_the_order(ids_dir: Callable[[int], Path], persistent: bool) -> None:
    data = ids_dir(N)
    plain = _loader(data, 1, 3, shuffle_seed=4)
    workers = _loader(data, 1, 3, shuffle_seed=4, num_workers=2, persistent_workers=persistent)
    assert [_ids(plain), _ids(plain)] == [_ids(workers), _ids(workers)]
    workers.dataset.set_epoch(0)  # reaches persistent workers too
    assert _ids(workers) == _ids(_loader(data, 1, 3, shuffle_seed=4))


def test_dtypes_and_map_style_dataset(ids_dir: Callable[[int], Path]) -> None:
    data = ids_dir(N)
    batch = next(iter(_loader(data, 0, 1)))
    assert batch["input_ids"].dtype == torch.int64 and batch["input_ids"].shape == (4, 4)
    stored = next(iter(_loader(data, 0, 1, int_dtype="stored")))
    assert stored["input_ids"].dtype == torch.int32
    ds = HDF5Dataset(data)
    assert len(ds) == N and ds[57]["input_ids"][0] == 57 and ds[-1]["input_ids"][0] == N - 1
    loader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=False, drop_last=True)
    got = torch.cat([b["input_ids"][:, 0] for b in loader])
    assert got.tolist() == list(range(96))
    picked = ds.read_batch([93, 2, 41, 11, 12])  # across shard files, out of order
    assert picked["input_ids"][:, 0].tolist() == [93, 2, 41, 11, 12]


def test_input_config_and_dataloader(ids_dir: Callable[[int], Path]) -> None:
    data = ids_dir(N)
    config = HDF5InputConfig.from_params({"data_dir": str(data), "batch_size": 5, "shuffle_seed": 2,
                                          "max_sequence_length": 4, "data_processor": "GptHDF5DataProcessor"})
    loader = hdf5_dataloader(config, shard_index=1, num_shards=2)
    assert len(loader) == 10 and all(b["input_ids"].shape == (5, 4) for b in loader)
    with pytest.raises(ConfigError, match="train_input.bacth_size: unknown key. Did you mean 'batch_size'"):
        HDF5InputConfig.from_params({"data_dir": str(data), "batch_size": 5, "bacth_size": 5})
    with pytest.raises(ConfigError, match="eval_input.batch_size: '5' must be a whole number"):
        HDF5InputConfig.from_params({"data_dir": str(data), "batch_size": "5"}, "eval_input")
    with pytest.raises(ConfigError, match="input.batch_size: 0 must be at least 1"):
        hdf5_dataloader(HDF5InputConfig(data_dir=str(data), batch_size=0))
    with pytest.raises(ConfigError, match="train_input.data_dir: empty"):
        hdf5_dataloader(HDF5InputConfig(batch_size=5), section="train_input")
    with pytest.raises(DataError, match="vocab_size 3 is smaller than the vocabulary"):
        hdf5_dataloader(HDF5InputConfig(data_dir=str(data), batch_size=5), vocab_size=3)
    with pytest.raises(DataError, match="max_sequence_length 128 does not match"):
        hdf5_dataloader(HDF5InputConfig(data_dir=str(data), batch_size=5, max_sequence_length=128))
    with pytest.raises(DataError, match="reads mlm_nsp but"):
        hdf5_dataloader(HDF5InputConfig(data_dir=str(data), batch_size=5, data_processor="BertHDF5DataProcessor"))
    with pytest.raises(DataError, match="too few for 3 shard"):
        HDF5ShardDataset(data, batch_size=40, num_shards=3)
    with pytest.raises(DataError, match="shard_index must be in 0..1"):
        HDF5ShardDataset(data, batch_size=4, shard_index=2, num_shards=2)
    with pytest.raises(DataError, match="no metadata.json"):
        HDF5Dataset(data.parent)
