"""What every dataset loader returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset


@dataclass(frozen=True)
class Splits:
    """Train and validation datasets of ``(input, label)`` pairs.

    Attributes:
        train, val: the datasets (``TensorDataset`` for in-memory data).
        num_classes: labels are ``0 .. num_classes - 1``.
        input_shape: shape of one input, e.g. ``(1, 28, 28)``.
        description: where the data came from and how it was split.
    """

    train: Dataset[Any]
    val: Dataset[Any]
    num_classes: int
    input_shape: tuple[int, ...]
    description: str = ""


def split_arrays(
    images: np.ndarray,
    labels: np.ndarray,
    *,
    train_size: int,
    val_size: int,
    seed: int,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """A seeded random split into disjoint train and validation parts."""
    if train_size + val_size > len(images):
        raise ValueError(
            f"train_size + val_size ({train_size} + {val_size}) exceeds the {len(images)} samples"
        )
    order = np.random.default_rng(seed).permutation(len(images))
    train, val = order[:train_size], order[train_size : train_size + val_size]
    return (images[train], labels[train]), (images[val], labels[val])


def to_tensor_dataset(
    images: np.ndarray, labels: np.ndarray, mean: float | np.ndarray, std: float | np.ndarray
) -> TensorDataset:
    """Float32 inputs standardised with ``mean``/``std``, int64 labels."""
    x = (images.astype(np.float32) - mean) / std
    return TensorDataset(
        torch.from_numpy(x.astype(np.float32)), torch.from_numpy(labels.astype(np.int64))
    )
