"""scikit-learn's handwritten digits: 1,797 images of 8x8 pixels (UCI), bundled with sklearn."""

from __future__ import annotations

from trainhub.data.splits import Splits, split_indices, to_tensor_dataset


def load_digits(*, val_fraction: float = 0.2, seed: int = 0) -> Splits:
    """Digits as ``(1, 8, 8)`` images in [0, 16] standardised, split at random.

    Args:
        val_fraction: share of the 1,797 samples held out for validation.
        seed: seed of the split.
    """
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    images = bunch.images.reshape(-1, 1, 8, 8)
    labels = bunch.target
    val_size = round(len(images) * val_fraction)
    train, val = split_indices(
        len(images), train_size=len(images) - val_size, val_size=val_size, seed=seed
    )
    xt = images[train]
    mean, std = float(xt.mean()), float(xt.std())
    return Splits(
        to_tensor_dataset(xt, labels[train], mean, std, sample_ids=train),
        to_tensor_dataset(images[val], labels[val], mean, std, sample_ids=val),
        num_classes=10,
        input_shape=(1, 8, 8),
        description=f"sklearn digits, {len(train)} train / {len(val)} val, seed {seed}",
        source="digits",
    )


def digit_images(ids: list[int]) -> list[list[list[int]]]:
    """The 8x8 images (pixel values 0-16) of the given sample ids, for image grids."""
    from sklearn.datasets import load_digits as sklearn_digits

    images = sklearn_digits().images
    return [images[i].astype(int).tolist() for i in ids]
