"""The loader pipeline: shard across ranks, batch, load in worker processes, feed the device.

Two loaders, one interface (iterate for ``(inputs, labels)`` batches; ``set_epoch`` reshuffles):

- :class:`TensorBatchLoader` for in-memory tensors (digits, MNIST, CIFAR-10): batches are
  slices of a seeded permutation, a few microseconds each; no worker processes needed.
- ``torch.utils.data.DataLoader`` for everything else, with worker processes, prefetching,
  persistent workers and pinned host memory when the device is a GPU.

Both shard the data across ranks (each rank a disjoint ``1/world_size`` of every epoch, padded so
every rank runs the same number of steps, which DDP needs). :class:`DevicePrefetcher` copies the
next batch to the GPU on a side stream while the current one computes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

Batch = tuple[torch.Tensor, ...]


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class TensorBatchLoader:
    """Batches of in-memory tensors by index slicing, sharded across ranks.

    Args:
        dataset: a ``TensorDataset``.
        batch_size: per-rank batch size.
        shuffle: reshuffle every epoch (seeded by ``seed + epoch``, identical on all ranks).
        drop_last: drop this rank's last incomplete batch.
        rank, world_size: default from ``torch.distributed`` (or 0 and 1).
    """

    def __init__(
        self,
        dataset: TensorDataset,
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        self.tensors = dataset.tensors
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _indices(self) -> torch.Tensor:
        n = len(self.tensors[0])
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=generator)
        else:
            order = torch.arange(n)
        per_rank = -(-n // self.world_size)
        padded = torch.cat([order, order[: per_rank * self.world_size - n]])
        return padded[self.rank :: self.world_size]

    def __len__(self) -> int:
        per_rank = -(-len(self.tensors[0]) // self.world_size)
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        indices = self._indices()
        for start in range(0, len(indices), self.batch_size):
            chunk = indices[start : start + self.batch_size]
            if self.drop_last and len(chunk) < self.batch_size:
                return
            yield tuple(t[chunk] for t in self.tensors)


def make_loader(
    dataset: Dataset[Any],
    batch_size: int,
    *,
    shuffle: bool = True,
    drop_last: bool = False,
    seed: int = 0,
    num_workers: int = 0,
    prefetch_factor: int | None = 2,
    device: torch.device | str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> TensorBatchLoader | DataLoader[Any]:
    """A sharded loader for ``dataset``: :class:`TensorBatchLoader` for in-memory tensors with
    ``num_workers == 0``, else a ``DataLoader`` with a ``DistributedSampler``.

    Args:
        num_workers: loader processes; they build batches while the device computes.
        prefetch_factor: batches each worker prepares ahead.
        device: pins host memory when it is a GPU (faster, asynchronous copies).

    A shuffled dataset with sample ids honours ``TRAINHUB_SAMPLE_FILTER`` (the samples a
    ``trainhub clone --drop-flagged/--relabel`` trial leaves out or relabels).

    Example (every rank):
        >>> loader = make_loader(splits.train, 128, num_workers=4, device="cuda:0")
        >>> for epoch in range(epochs):
        ...     set_epoch(loader, epoch)
        ...     for x, y in DevicePrefetcher(loader, "cuda:0"):
        ...         ...
    """
    rank, world_size = _rank_and_world(rank, world_size)
    if shuffle:  # a training set: leave out / relabel what a `clone --drop-flagged` names
        from trainhub.runtime.sample_filter import apply_sample_filter

        dataset = apply_sample_filter(dataset)
    if isinstance(dataset, TensorDataset) and num_workers == 0:
        return TensorBatchLoader(
            dataset,
            batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            seed=seed,
            rank=rank,
            world_size=world_size,
        )
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=False
    )
    pin = device is not None and torch.device(device).type == "cuda"
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=drop_last,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor if num_workers > 0 else None,
        persistent_workers=num_workers > 0,
        pin_memory=pin,
    )


def set_epoch(loader: Any, epoch: int) -> None:
    """Reshuffle a loader from :func:`make_loader` for ``epoch`` (same order on all ranks)."""
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, DistributedSampler):
        sampler.set_epoch(epoch)


class DevicePrefetcher:
    """Iterate a loader with each batch already on ``device``.

    On a GPU the copy of batch ``i + 1`` runs on a side stream while batch ``i`` computes
    (host memory must be pinned for the copy to be asynchronous; :func:`make_loader` pins it).
    On a CPU it only moves tensors, which is a no-op.
    """

    def __init__(self, loader: Any, device: torch.device | str) -> None:
        self.loader = loader
        self.device = torch.device(device)
        self._stream = (
            torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            if self.device.type == "cuda"
            else None
        )

    def __len__(self) -> int:
        return len(self.loader)

    def _to_device(self, batch: Any) -> Batch:
        return tuple(t.to(self.device, non_blocking=True) for t in batch)

    def __iter__(self) -> Iterator[Batch]:
        if self._stream is None:
            for batch in self.loader:
                yield self._to_device(batch)
            return
        iterator = iter(self.loader)
        current = torch.cuda.current_stream(self.device)
        try:
            first = next(iterator)
        except StopIteration:
            return
        with torch.cuda.stream(self._stream):
            ready = self._to_device(first)
        for batch in iterator:
            out = self._hand_over(ready, current)
            with torch.cuda.stream(self._stream):  # copy the next batch during this one
                ready = self._to_device(batch)
            yield out
        yield self._hand_over(ready, current)

    def _hand_over(self, batch: Batch, current: torch.cuda.Stream) -> Batch:
        assert self._stream is not None
        current.wait_stream(self._stream)
        for tensor in batch:
            tensor.record_stream(current)  # its memory is now used by the compute stream
        return batch
