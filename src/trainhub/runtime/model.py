"""How a model is wrapped for data-parallel training: the communication-strategy extension point.

:meth:`Context.prepare_model <trainhub.runtime.context.Context.prepare_model>` moves the model to
its device and, with several ranks, hands it to a :class:`BaseCommStrategy`, whose one method
takes the model and returns the module to train. :func:`make_strategy` is the single place that
turns the spec's ``distributed`` section (``TRAINHUB_DISTRIBUTED``) into a strategy; communication
strategies (compression hooks, local SGD, ...) plug in there. Today it knows ``allreduce``
(plain DDP) and refuses any other name rather than silently training without what was asked.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainhub.runtime import protocol


class BaseCommStrategy(ABC):
    """Wraps a model so that its ranks exchange gradients (or weights) in some way."""

    name: ClassVar[str]

    @abstractmethod
    def wrap(self, model: nn.Module, *, device: torch.device) -> nn.Module:
        """Return the module to train; ``model`` is already on ``device``.

        Called on every rank with the process group set up and world size > 1.
        """


class AllReduceStrategy(BaseCommStrategy):
    """DistributedDataParallel: fp32 gradients averaged by ring all-reduce after each backward.

    Args:
        bucket_cap_mb: DDP bucket size (None: DDP's default, 25 MB).
        find_unused_parameters: Allow parameters that get no gradient in a step (slower).
    """

    name = "allreduce"

    def __init__(self, bucket_cap_mb: float | None = None, find_unused_parameters: bool = False):
        self.bucket_cap_mb = bucket_cap_mb
        self.find_unused_parameters = find_unused_parameters

    def wrap(self, model: nn.Module, *, device: torch.device) -> nn.Module:
        return DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=self.bucket_cap_mb,
            find_unused_parameters=self.find_unused_parameters,
        )


def make_strategy(config: Mapping[str, Any] | None) -> BaseCommStrategy:
    """The strategy the spec's ``distributed`` section asks for (default: ``allreduce``).

    Raises:
        ValueError: The section names a strategy this runtime does not have.
    """
    config = config or {}
    name = config.get("strategy", AllReduceStrategy.name)
    if name == AllReduceStrategy.name:
        return AllReduceStrategy(
            bucket_cap_mb=config.get("bucket_cap_mb"),
            find_unused_parameters=bool(config.get("find_unused_parameters", False)),
        )
    raise ValueError(
        f"{protocol.ENV_DISTRIBUTED} asks for strategy {name!r}, which this trainhub runtime "
        f"does not provide (available: {AllReduceStrategy.name!r}); remove distributed.strategy "
        "from the spec or pass prepare_model(model, strategy=...)"
    )


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP (or similar) wrapper; the model itself if unwrapped.

    Save ``unwrap_model(model).state_dict()`` so checkpoints load the same way with one rank
    (no wrapper) and with many.
    """
    while isinstance(model, DistributedDataParallel):
        model = model.module
    return model
