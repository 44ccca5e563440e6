"""Datasets and the loader pipeline.

    >>> from trainhub import data
    >>> splits = data.load("digits")            # or "mnist", "cifar10", "synthetic"
    >>> loader = data.make_loader(splits.train, batch_size=64, shuffle=True)

Every loader returns a :class:`~trainhub.data.splits.Splits` (train and validation datasets of
``(image, label)`` pairs, the number of classes and the input shape). Heavy imports happen when
a dataset is loaded, not when this package is imported.
"""

from __future__ import annotations

from typing import Any

from trainhub.data.splits import Splits

__all__ = ["Splits", "available", "load", "make_loader"]

_LOADERS = {
    "digits": ("trainhub.data.digits", "load_digits"),
    "mnist": ("trainhub.data.mnist", "load_mnist"),
    "cifar10": ("trainhub.data.cifar10", "load_cifar10"),
    "synthetic": ("trainhub.data.synthetic", "load_synthetic"),
}


def available() -> list[str]:
    return sorted(_LOADERS)


def load(name: str, **kwargs: Any) -> Splits:
    """Load the dataset called ``name`` with its loader's keyword arguments."""
    import importlib

    if name not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(available())}")
    module, attribute = _LOADERS[name]
    splits: Splits = getattr(importlib.import_module(module), attribute)(**kwargs)
    return splits


def make_loader(*args: Any, **kwargs: Any) -> Any:
    """See :func:`trainhub.data.loader.make_loader`."""
    from trainhub.data.loader import make_loader as _make_loader

    return _make_loader(*args, **kwargs)
