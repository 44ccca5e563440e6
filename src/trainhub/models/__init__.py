"""The model zoo: models a user (or a benchmark) can name in a spec or script.

    >>> from trainhub import models
    >>> net = models.create("resnet20", num_classes=10, in_channels=3)
    >>> models.available()
    ['lenet5', 'mlp', 'resnet18', 'resnet20', 'transformer']

Every model takes ``num_classes`` and returns logits; each names its repeated blocks in
``checkpoint_block_types`` (activation checkpointing and FSDP wrap those).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from torch import nn

# name -> (module, factory); resolved lazily so that naming a model imports only its module
_REGISTRY: dict[str, tuple[str, str]] = {
    "mlp": ("trainhub.models.mlp", "MLP"),
    "lenet5": ("trainhub.models.lenet", "LeNet5"),
    "resnet20": ("trainhub.models.resnet", "resnet20"),
    "resnet18": ("trainhub.models.resnet", "resnet18"),
    "transformer": ("trainhub.models.transformer", "TransformerClassifier"),
}

__all__ = ["available", "count_parameters", "create"]


def available() -> list[str]:
    """Names :func:`create` accepts."""
    return sorted(_REGISTRY)


def _factory(name: str) -> Callable[..., nn.Module]:
    key = name.lower().replace("-", "").replace("_", "")
    if key not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(available())}")
    module, attribute = _REGISTRY[key]
    factory: Callable[..., nn.Module] = getattr(importlib.import_module(module), attribute)
    return factory


def create(name: str, **kwargs: Any) -> nn.Module:
    """Build the model called ``name`` (case, ``-`` and ``_`` ignored) with ``kwargs``.

    Raises:
        ValueError: no model has that name.
    """
    return _factory(name)(**kwargs)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
