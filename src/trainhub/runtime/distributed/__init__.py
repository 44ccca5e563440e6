"""Distributed training strategies of the trainhub runtime (see docs/distributed.md).

The runtime calls :func:`apply_strategy` with the trial's :class:`DistributedConfig` (parsed from
``TRAINHUB_DISTRIBUTED``) and hands the user the prepared model; :class:`StepTimer` says where a
step's time goes. Names are loaded lazily so that reading the config does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainhub.runtime.distributed.comm_meter import CommMeter
    from trainhub.runtime.distributed.config import DistributedConfig
    from trainhub.runtime.distributed.large_batch import (
        GradientAccumulator,
        linear_scaled_lr,
        linear_scaling_warmup,
    )
    from trainhub.runtime.distributed.memory import (
        MixedPrecision,
        apply_activation_checkpointing,
        apply_fsdp,
    )
    from trainhub.runtime.distributed.onebit import OneBitState, onebit_hook
    from trainhub.runtime.distributed.optim import LAMB, LARS, build_optimizer
    from trainhub.runtime.distributed.strategies import (
        COMM_STRATEGIES,
        PreparedModel,
        apply_strategy,
        make_comm_hook,
        make_comm_strategy,
    )
    from trainhub.runtime.distributed.timing import StepTimer
    from trainhub.runtime.distributed.topk import TopKState, topk_hook

_EXPORTS = {
    "CommMeter": "comm_meter",
    "DistributedConfig": "config",
    "GradientAccumulator": "large_batch",
    "linear_scaled_lr": "large_batch",
    "linear_scaling_warmup": "large_batch",
    "MixedPrecision": "memory",
    "apply_activation_checkpointing": "memory",
    "apply_fsdp": "memory",
    "OneBitState": "onebit",
    "onebit_hook": "onebit",
    "LAMB": "optim",
    "LARS": "optim",
    "build_optimizer": "optim",
    "COMM_STRATEGIES": "strategies",
    "make_comm_strategy": "strategies",
    "PreparedModel": "strategies",
    "apply_strategy": "strategies",
    "make_comm_hook": "strategies",
    "StepTimer": "timing",
    "TopKState": "topk",
    "topk_hook": "topk",
}

__all__ = [
    "COMM_STRATEGIES",
    "LAMB",
    "LARS",
    "CommMeter",
    "DistributedConfig",
    "GradientAccumulator",
    "MixedPrecision",
    "OneBitState",
    "PreparedModel",
    "StepTimer",
    "TopKState",
    "apply_activation_checkpointing",
    "apply_fsdp",
    "apply_strategy",
    "build_optimizer",
    "linear_scaled_lr",
    "linear_scaling_warmup",
    "make_comm_hook",
    "make_comm_strategy",
    "onebit_hook",
    "topk_hook",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
