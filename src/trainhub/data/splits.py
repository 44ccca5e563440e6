"""What every dataset loader returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch is imported when a dataset is built, not with this module
    from torch.utils.data import Dataset

    from trainhub.data.indexed import SampleDataset


@dataclass(frozen=True)
class Splits:
    """Train and validation datasets of ``(input, label)`` pairs.

    In-memory datasets are :class:`~trainhub.data.indexed.SampleDataset` s: they carry
    ``sample_ids`` (each sample's index in the source files, the same for every split seed)
    and ``with_ids()`` yields ``(input, label, id)`` triples for ``ctx.track_samples``.

    Attributes:
        train, val: the datasets (``TensorDataset`` for in-memory data).
        num_classes: labels are ``0 .. num_classes - 1``.
        input_shape: shape of one input, e.g. ``(1, 28, 28)``.
        description: where the data came from and how it was split.
        source: the name the sample ids index (``mnist/t10k``, ``digits``), or "".
    """

    train: Dataset[Any]
    val: Dataset[Any]
    num_classes: int
    input_shape: tuple[int, ...]
    description: str = ""
    source: str = ""


def split_arrays(
    images: np.ndarray,
    labels: np.ndarray,
    *,
    train_size: int,
    val_size: int,
    seed: int,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """A seeded random split into disjoint train and validation parts (see
    :func:`split_indices` for the positions)."""
    if train_size + val_size > len(images):
        raise ValueError(
            f"train_size + val_size ({train_size} + {val_size}) exceeds the {len(images)} samples"
        )
    train, val = split_indices(len(images), train_size=train_size, val_size=val_size, seed=seed)
    return (images[train], labels[train]), (images[val], labels[val])


def split_indices(
    total: int, *, train_size: int, val_size: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The positions :func:`split_arrays` puts in the train and validation parts."""
    if train_size + val_size > total:
        raise ValueError(
            f"train_size + val_size ({train_size} + {val_size}) exceeds the {total} samples"
        )
    order = np.random.default_rng(seed).permutation(total)
    return order[:train_size], order[train_size : train_size + val_size]


def to_tensor_dataset(
    images: np.ndarray,
    labels: np.ndarray,
    mean: float | np.ndarray,
    std: float | np.ndarray,
    sample_ids: np.ndarray | None = None,
) -> SampleDataset:
    """Float32 inputs standardised with ``mean``/``std``, int64 labels, and the samples' ids
    (default ``0 .. n - 1``)."""
    import torch

    from trainhub.data.indexed import SampleDataset

    x = (images.astype(np.float32) - mean) / std
    ids = np.arange(len(labels)) if sample_ids is None else sample_ids
    return SampleDataset(
        torch.from_numpy(x.astype(np.float32)),
        torch.from_numpy(labels.astype(np.int64)),
        sample_ids=torch.from_numpy(np.asarray(ids, dtype=np.int64)),
    )
