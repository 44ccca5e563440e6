"""Sharding a dataset across ranks: each rank trains on its own 1/world_size of every epoch."""

from __future__ import annotations

from typing import Any, TypeVar

from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

T = TypeVar("T")


def make_data_loader(
    dataset: Dataset[T],
    batch_size: int,
    *,
    shuffle: bool,
    rank: int,
    world_size: int,
    seed: int = 0,
    **kwargs: Any,
) -> DataLoader[T]:
    """A DataLoader over this rank's shard (a DistributedSampler) when world size > 1.

    A shuffled (training) dataset with sample ids loses the samples a ``trainhub clone
    --drop-flagged`` trial leaves out, and takes its relabels (runtime/sample_filter.py).
    """
    if shuffle:
        from trainhub.runtime.sample_filter import apply_sample_filter

        dataset = apply_sample_filter(dataset)
    if world_size <= 1:
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, **kwargs)
    if isinstance(dataset, IterableDataset):
        raise TypeError(
            "prepare_data_loader() shards map-style datasets; an IterableDataset must shard "
            "itself (use ctx.rank and ctx.world_size) and go into a plain DataLoader"
        )
    if "sampler" in kwargs or "batch_sampler" in kwargs:
        raise ValueError(
            "prepare_data_loader() chooses the sampler (DistributedSampler) when world size > 1; "
            "build the DataLoader yourself to use your own sampler"
        )
    sampler: DistributedSampler[T] = DistributedSampler(
        dataset,
        num_replicas=world_size,
        rank=rank,
        shuffle=shuffle,
        seed=seed,
        # pads the last shard with repeats: every rank must run the same number of steps, or
        # DDP's all-reduce waits forever for the rank that finished early
        drop_last=False,
    )
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **kwargs)


def set_loader_epoch(loader: DataLoader[Any], epoch: int) -> None:
    """Reseed the shuffle of a sharded loader (a no-op for other loaders)."""
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, DistributedSampler):
        sampler.set_epoch(epoch)
