"""The runtime's view of the spec's ``distributed`` section.

The section is defined once, in the leaf module :mod:`trainhub.distributed_contract` (pydantic,
no torch), which the control plane validates submitted specs with too. The control plane hands
its JSON to every rank in ``TRAINHUB_DISTRIBUTED``; :meth:`DistributedConfig.from_env` reads it
(errors name the field: ``distributed.topk.density: ...``). Scripts run outside trainhub (plain
``torchrun``) get the defaults. Importing this module does not import torch.
"""

from __future__ import annotations

from trainhub.distributed_contract import (
    ENV_DISTRIBUTED,
    STRATEGY_CONFIGS,
    LargeBatchSpec,
    LocalSGDSpec,
    MemorySpec,
    OneBitSpec,
    ParameterServerSpec,
    PowerSGDSpec,
    TopKSpec,
)
from trainhub.distributed_contract import DistributedSpec as DistributedConfig

PowerSGDConfig = PowerSGDSpec
OneBitConfig = OneBitSpec
TopKConfig = TopKSpec
LocalSGDConfig = LocalSGDSpec
ParameterServerConfig = ParameterServerSpec
LargeBatchConfig = LargeBatchSpec
MemoryConfig = MemorySpec

__all__ = [
    "ENV_DISTRIBUTED",
    "STRATEGY_CONFIGS",
    "DistributedConfig",
    "LargeBatchConfig",
    "LocalSGDConfig",
    "MemoryConfig",
    "OneBitConfig",
    "ParameterServerConfig",
    "PowerSGDConfig",
    "TopKConfig",
]
