"""CIFAR-10 in its binary distribution format (Krizhevsky 2009, ``cifar-10-batches-bin``).

Each record is 3,073 bytes: the label (0-9), then 1,024 red, 1,024 green and 1,024 blue pixel
values of a 32x32 image in row-major order. Training data is ``data_batch_1.bin`` ..
``data_batch_5.bin`` (10,000 records each), validation ``test_batch.bin``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainhub.data.splits import Splits, to_tensor_dataset

RECORD_BYTES = 1 + 3 * 32 * 32
# per-channel mean and std of the training set, in pixel units
MEAN = np.array([125.3, 123.0, 113.9], dtype=np.float32).reshape(1, 3, 1, 1)
STD = np.array([63.0, 62.1, 66.7], dtype=np.float32).reshape(1, 3, 1, 1)


def read_cifar10_binary(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Images ``(N, 3, 32, 32)`` uint8 and labels ``(N,)`` of one binary batch file."""
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % RECORD_BYTES:
        raise ValueError(f"{path}: {raw.size} bytes is not a whole number of 3073-byte records")
    records = raw.reshape(-1, RECORD_BYTES)
    labels = records[:, 0].astype(np.int64)
    if labels.max() > 9:
        raise ValueError(f"{path}: label {labels.max()} out of range 0-9")
    return records[:, 1:].reshape(-1, 3, 32, 32).copy(), labels


def write_cifar10_binary(path: str | Path, images: np.ndarray, labels: np.ndarray) -> None:
    """Write images ``(N, 3, 32, 32)`` uint8 and labels in the binary format."""
    images = np.ascontiguousarray(images, dtype=np.uint8).reshape(len(images), -1)
    records = np.concatenate([np.asarray(labels, dtype=np.uint8).reshape(-1, 1), images], axis=1)
    records.tofile(path)


def load_cifar10(root: str | Path, *, max_train: int | None = None) -> Splits:
    """CIFAR-10 from a ``cifar-10-batches-bin`` directory, standardised per channel.

    Args:
        root: directory with ``data_batch_*.bin`` and ``test_batch.bin``.
        max_train: keep only the first this many training images (quick runs).
    """
    root = Path(root)
    batches = sorted(root.glob("data_batch_*.bin"))
    if not batches or not (root / "test_batch.bin").exists():
        raise FileNotFoundError(f"{root}: need data_batch_*.bin and test_batch.bin")
    parts = [read_cifar10_binary(b) for b in batches]
    xt = np.concatenate([p[0] for p in parts])[:max_train]
    yt = np.concatenate([p[1] for p in parts])[:max_train]
    xv, yv = read_cifar10_binary(root / "test_batch.bin")
    return Splits(
        to_tensor_dataset(xt, yt, MEAN, STD),
        to_tensor_dataset(xv, yv, MEAN, STD),
        num_classes=10,
        input_shape=(3, 32, 32),
        description=f"CIFAR-10 binary at {root}, {len(xt)} train / {len(xv)} val",
    )
