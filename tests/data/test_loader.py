"""The loader pipeline: sharding across ranks, epochs, workers, device prefetching."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainhub.data.loader import DevicePrefetcher, TensorBatchLoader, make_loader, set_epoch
from trainhub.data.synthetic import SyntheticClassification


def _dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n).float().unsqueeze(1), torch.arange(n))


def _labels(loader: object) -> list[int]:
    return [int(v) for _, y in loader for v in y]  # type: ignore[attr-defined]


@pytest.mark.parametrize("n", [20, 23])
def test_ranks_get_disjoint_shards_that_cover_the_epoch(n: int) -> None:
    shards = [_labels(make_loader(_dataset(n), 4, rank=r, world_size=3, seed=1)) for r in range(3)]
    assert len({len(s) for s in shards}) == 1  # equal steps on every rank
    assert set().union(*map(set, shards)) == set(range(n))
    if n % 3 == 0:
        assert sum(map(len, shards)) == n


def test_set_epoch_reshuffles_the_same_way_everywhere() -> None:
    a = make_loader(_dataset(50), 10, rank=0, world_size=1)
    b = make_loader(_dataset(50), 10, rank=0, world_size=1)
    first = _labels(a)
    set_epoch(a, 1)
    set_epoch(b, 1)
    assert _labels(a) == _labels(b) != first


def test_drop_last_and_len() -> None:
    loader = make_loader(_dataset(10), 4, drop_last=True, world_size=1, rank=0)
    assert isinstance(loader, TensorBatchLoader)
    assert len(loader) == 2 == len(list(loader))
    assert len(make_loader(_dataset(10), 4, world_size=1, rank=0)) == 3


def test_other_datasets_go_through_dataloader_workers() -> None:
    dataset = SyntheticClassification(40, (2,), 4)
    loader = make_loader(dataset, 8, num_workers=2, rank=1, world_size=2, shuffle=False)
    assert isinstance(loader, DataLoader)
    batches = list(DevicePrefetcher(loader, "cpu"))
    assert len(batches) == 3
    assert sum(len(y) for _, y in batches) == 20
    assert loader.pin_memory is False  # only for GPUs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_prefetcher_copies_to_the_gpu_in_order() -> None:
    loader = make_loader(_dataset(64), 8, shuffle=False, rank=0, world_size=1)
    got = [y for _, y in DevicePrefetcher(loader, "cuda")]
    assert all(y.is_cuda for y in got)
    assert torch.cat(got).cpu().tolist() == list(range(64))
