"""In-memory datasets that know their samples' ids (for ``ctx.track_samples``, ``clone``).

A sample id is the sample's index in the dataset's source files (the 10,000 MNIST test images,
sklearn's 1,797 digits), so it names the same image in every trial whatever the split seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch.utils.data import TensorDataset


class SampleDataset(TensorDataset):
    """A ``TensorDataset`` of ``(input, label)`` with one id per sample in ``sample_ids``.

    Example:
        >>> splits = trainhub.data.load("digits")  # doctest: +SKIP
        >>> loader = ctx.prepare_data_loader(splits.train.with_ids(), batch_size=64)
        >>> for x, y, ids in loader:  # doctest: +SKIP
        ...     ctx.track_samples(ids, model(x), y, epoch=epoch, source=splits.source)
    """

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor, *, sample_ids: torch.Tensor):
        if len(sample_ids) != len(labels):
            raise ValueError(f"{len(sample_ids)} sample ids for {len(labels)} samples")
        super().__init__(inputs, labels)
        self.sample_ids = sample_ids

    def with_ids(self) -> TensorDataset:
        """The same samples as ``(input, label, id)`` triples."""
        return IdTensorDataset(*self.tensors, self.sample_ids)

    def filtered(
        self, drop: Sequence[int] = (), relabel: Mapping[int, int] | None = None
    ) -> SampleDataset:
        """A copy without the samples whose ids are in ``drop`` and with the labels of
        ``relabel`` (id -> new label) replaced."""
        inputs, labels = self.tensors
        return _filtered(inputs, labels, self.sample_ids, drop, relabel or {})


class IdTensorDataset(TensorDataset):
    """``(input, label, id)`` triples; ``sample_ids`` is the id tensor."""

    @property
    def sample_ids(self) -> torch.Tensor:
        return self.tensors[2]

    def filtered(
        self, drop: Sequence[int] = (), relabel: Mapping[int, int] | None = None
    ) -> IdTensorDataset:
        inputs, labels, ids = self.tensors
        kept = _filtered(inputs, labels, ids, drop, relabel or {})
        return IdTensorDataset(*kept.tensors, kept.sample_ids)


def _filtered(
    inputs: torch.Tensor,
    labels: torch.Tensor,
    ids: torch.Tensor,
    drop: Sequence[int],
    relabel: Mapping[int, int],
) -> SampleDataset:
    keep = ~torch.isin(ids, torch.as_tensor(list(drop), dtype=ids.dtype))
    labels = labels.clone()
    if relabel:
        new_ids = torch.as_tensor(list(relabel), dtype=ids.dtype)
        new_labels = torch.as_tensor(list(relabel.values()), dtype=labels.dtype)
        order = torch.argsort(new_ids)
        new_ids, new_labels = new_ids[order], new_labels[order]
        where = torch.searchsorted(new_ids, ids).clamp(max=len(new_ids) - 1)
        hit = new_ids[where] == ids
        labels[hit] = new_labels[where[hit]]
    return SampleDataset(inputs[keep], labels[keep], sample_ids=ids[keep])
