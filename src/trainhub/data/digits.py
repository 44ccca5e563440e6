"""scikit-learn's handwritten digits: 1,797 images of 8x8 pixels (UCI), bundled with sklearn."""

from __future__ import annotations

from trainhub.data.splits import Splits, split_arrays, to_tensor_dataset


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
    (xt, yt), (xv, yv) = split_arrays(
        images, labels, train_size=len(images) - val_size, val_size=val_size, seed=seed
    )
    mean, std = float(xt.mean()), float(xt.std())
    return Splits(
        to_tensor_dataset(xt, yt, mean, std),
        to_tensor_dataset(xv, yv, mean, std),
        num_classes=10,
        input_shape=(1, 8, 8),
        description=f"sklearn digits, {len(xt)} train / {len(xv)} val, seed {seed}",
    )
