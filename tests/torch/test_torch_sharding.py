"""Sharding and the system's refusals, without MPI."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

from csrun.stream.source import EPOCH_END
from csrun.torch.sharding import LoaderSource
from csrun.torch.sharding import DataLoaderError, ShardSampler, plan_shard, shard_loader

pytestmark = pytest.mark.timeout(30)


class Ids(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


class Stream(IterableDataset):
    def __iter__(self):
        yield from (torch.tensor(i) for i in range(6))


def _source(loader: DataLoader, shard: int, shards: int) -> LoaderSource:
    plan = plan_shard(loader, shard, shards)
    local, sampler = shard_loader(loader, plan)
    return LoaderSource(local, sampler, plan)


def _take(source: LoaderSource, count: int, skip: int = 0) -> list:
    out, items = [], source.stream(skip)
    while len(out) < count:
        item = next(items)
        out.append("END" if item is EPOCH_END else item.tolist())
    return out


def test_shard_sampler_takes_every_sth_sample():
    base = list(range(10))
    assert [list(ShardSampler(base, k, 3)) for k in range(3)] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert len(ShardSampler(list(range(12)), 1, 3)) == 4
    s = ShardSampler(list(range(12)), 1, 3)
    s.skip = 2
    assert list(s) == [7, 10] and list(s) == [1, 4, 7, 10]  # the skip applies to one pass only


def test_shards_batch_like_the_legacy_sampler():
    loader = DataLoader(Ids(12), batch_size=2, drop_last=True)
    assert _take(_source(loader, 0, 2), 4) == [[0, 2], [4, 6], [8, 10], "END"]
    assert _take(_source(loader, 1, 2), 4) == [[1, 3], [5, 7], [9, 11], "END"]
    assert _take(_source(loader, 0, 1), 7) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], "END"]


def test_skip_within_and_across_epochs_matches_the_unskipped_stream():
    gen = torch.Generator().manual_seed(7)
    loader = DataLoader(Ids(12), batch_size=2, drop_last=True, shuffle=True, generator=gen)
    full = [b for b in _take(_source(loader, 1, 2), 12) if b != "END"]  # 3 epochs of 3 batches
    for skip in (1, 3, 4, 7):
        gen.manual_seed(7)
        skipped = [b for b in _take(_source(loader, 1, 2), 12, skip) if b != "END"]
        assert skipped[: len(full) - skip] == full[skip:], skip


@pytest.mark.parametrize("kwargs, shards, message", [
    (dict(batch_size=2, drop_last=False), 1, r"drop_last must be set to True \(got drop_last=False\)"),
    (dict(batch_size=2, drop_last=True), 5,
     r"the dataset's 12 samples cannot be split evenly across 5 streamers \(12 % 5 = 2\)"),
    (dict(batch_size=4, drop_last=True), 4,
     r"streamer 0's shard holds 3 samples \(12 samples over 4 streamers\), fewer than one batch of 4"),
    (dict(batch_size=16, drop_last=True), 1, r"the dataset holds 12 samples, fewer than one batch of 16"),
    (dict(batch_size=None), 1, "batch_size=None"),
])
def test_refusals_name_the_value(kwargs, shards, message):
    with pytest.raises(DataLoaderError, match=message):
        plan_shard(DataLoader(Ids(12), **kwargs), 0, shards)


def test_a_custom_batch_sampler_shards_itself_and_streams_unchanged():
    """The 2.x zoo's CBSampler picks each task's batches itself: csrun must not shard it again."""
    class Mine(BatchSampler):
        pass

    custom = DataLoader(Ids(12), batch_sampler=Mine(SequentialSampler(range(12)), 2, True))
    for shard, shards in ((0, 1), (1, 3)):
        plan = plan_shard(custom, shard, shards)
        assert plan.self_sharding and not plan.presharded and plan.batches_per_epoch is None
        loader, sampler = shard_loader(custom, plan)
        assert loader is custom and sampler is None


def test_non_loaders_and_plain_batch_samplers_without_drop_last_are_refused():
    with pytest.raises(DataLoaderError, match="needs a torch.utils.data.DataLoader, got list"):
        plan_shard([1, 2], 0, 1)
    plain = DataLoader(Ids(12), batch_sampler=BatchSampler(SequentialSampler(range(12)), 3, False))
    with pytest.raises(DataLoaderError, match="drop_last must be set to True"):
        plan_shard(plain, 0, 1)


def test_iterable_datasets_shard_themselves():
    loader = DataLoader(Stream(), batch_size=4, drop_last=True)
    plan = plan_shard(loader, 1, 2)
    assert plan.iterable and plan.batches_per_epoch is None
    assert _take(_source(loader, 1, 2), 4) == [[0, 1, 2, 3], "END", [0, 1, 2, 3], "END"]
