"""The ``distributed`` section of the experiment spec, as the core sees it.

Defined once in the leaf module :mod:`trainhub.distributed_contract`, which the runtime parses
``TRAINHUB_DISTRIBUTED`` with too; re-exported here so the core's spec reads it from its own
package.
"""

from __future__ import annotations

from trainhub.distributed_contract import (
    STRATEGY_CONFIGS,
    Consistency,
    DistributedSpec,
    LargeBatchSpec,
    LocalSGDSpec,
    LrScaling,
    MemorySpec,
    OneBitSpec,
    OptimizerName,
    ParameterServerSpec,
    PipelineSchedule,
    PipelineSpec,
    PowerSGDSpec,
    Precision,
    Strategy,
    TopKSpec,
)

__all__ = [
    "STRATEGY_CONFIGS",
    "Consistency",
    "DistributedSpec",
    "LargeBatchSpec",
    "LocalSGDSpec",
    "LrScaling",
    "MemorySpec",
    "OneBitSpec",
    "OptimizerName",
    "ParameterServerSpec",
    "PipelineSchedule",
    "PipelineSpec",
    "PowerSGDSpec",
    "Precision",
    "Strategy",
    "TopKSpec",
]
