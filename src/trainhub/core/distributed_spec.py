"""The ``distributed`` section of the experiment spec: how the ranks of a trial cooperate.

Pure pydantic, no torch. The runtime never imports this module (layering): it receives the JSON
of this section in ``TRAINHUB_DISTRIBUTED`` and parses it into the frozen dataclass
``trainhub.runtime.distributed.config.DistributedConfig``, which enforces the same rules. A test
round-trips one into the other so the two cannot drift apart.

```yaml
distributed:
  strategy: powersgd          # allreduce | fp16 | bf16 | powersgd | onebit | topk | localsgd | ps
  bucket_cap_mb: 25
  powersgd: {rank: 4, start_step: 10}
  memory: {precision: bf16}
```
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Strategy(StrEnum):
    """How gradients (or weights) travel between the ranks of a trial."""

    ALLREDUCE = "allreduce"  # DDP, fp32 gradients, ring all-reduce
    FP16 = "fp16"  # DDP, gradients cast to float16 on the wire
    BF16 = "bf16"  # DDP, gradients cast to bfloat16 on the wire
    POWERSGD = "powersgd"  # DDP, low-rank (PowerSGD) gradients with error feedback
    ONEBIT = "onebit"  # DDP, sign bits + one scale per tensor, error feedback
    TOPK = "topk"  # DDP, the k largest gradient entries, error feedback, density warm-up
    LOCALSGD = "localsgd"  # DDP, then local steps with periodic model averaging
    PS = "ps"  # parameter server: shards as Ray actors, push gradients / pull weights


class Consistency(StrEnum):
    SYNC = "sync"  # every step waits for the gradients of all workers
    ASYNC = "async"  # apply each gradient when it arrives; unbounded staleness
    SSP = "ssp"  # stale-synchronous: the fastest worker is at most `staleness` steps ahead


class Precision(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"  # autocast to bfloat16 (CPU and GPU)
    FP16 = "fp16"  # autocast to float16 with a gradient scaler (GPU only)


class OptimizerName(StrEnum):
    SGD = "sgd"
    ADAMW = "adamw"
    LARS = "lars"  # layer-wise adaptive rate scaling (You et al. 2017), for large batches
    LAMB = "lamb"  # layer-wise adaptive moments (You et al. 2020), for large batches


class LrScaling(StrEnum):
    NONE = "none"
    LINEAR = "linear"  # lr * global_batch / reference_batch_size (Goyal et al. 2017)


class PowerSGDSpec(_Section):
    """PowerSGD (Vogels et al. 2019) as shipped by PyTorch."""

    rank: Annotated[
        int, Field(ge=1, le=64, description="Rank of the low-rank gradient approximation.")
    ] = 2
    start_step: Annotated[
        int,
        Field(ge=1, description="Plain all-reduce before this step (lets DDP settle buckets)."),
    ] = 10
    min_compression_rate: Annotated[
        float, Field(ge=1.0, description="Tensors that would shrink less stay uncompressed.")
    ] = 2.0
    error_feedback: Annotated[bool, Field(description="Carry the approximation error forward.")] = (
        True
    )
    warm_start: Annotated[
        bool, Field(description="Reuse last step's Q as the power-iteration seed.")
    ] = True

    @model_validator(mode="after")
    def _start_after_bucket_rebuild(self) -> PowerSGDSpec:
        if (self.error_feedback or self.warm_start) and self.start_step < 2:
            raise ValueError(
                "start_step must be >= 2 when error_feedback or warm_start is on "
                "(DDP rebuilds its buckets after the first step)"
            )
        return self


class OneBitSpec(_Section):
    """Sign of each gradient entry (1 bit) and one scale per tensor (mean |g|)."""

    start_step: Annotated[
        int, Field(ge=1, description="Plain all-reduce before this step (warm-up).")
    ] = 10
    error_feedback: Annotated[
        bool, Field(description="Carry what the signs lost to the next step.")
    ] = True


class TopKSpec(_Section):
    """Send only the largest gradient entries (by magnitude) of each bucket."""

    density: Annotated[
        float, Field(gt=0.0, le=1.0, description="Fraction of entries sent once warmed up.")
    ] = 0.01
    warmup_steps: Annotated[
        int,
        Field(ge=0, description="Density falls geometrically from 1 to `density` over these."),
    ] = 100
    start_step: Annotated[int, Field(ge=1, description="Plain all-reduce before this step.")] = 1
    error_feedback: Annotated[bool, Field(description="Keep unsent entries for the next step.")] = (
        True
    )


class LocalSGDSpec(_Section):
    """Post-local SGD (Lin et al. 2020): all-reduce first, then local steps + averaging."""

    period: Annotated[
        int, Field(ge=2, le=10_000, description="Local steps between two model averagings.")
    ] = 8
    start_step: Annotated[
        int, Field(ge=0, description="Steps of plain gradient all-reduce before local SGD.")
    ] = 100
    overlap: Annotated[
        bool,
        Field(
            description="Average in the background, one period late, while the ranks keep "
            "training (overlap local SGD): no rank waits for the network or for slower ranks."
        ),
    ] = False


class ParameterServerSpec(_Section):
    """Parameter shards as Ray actors; workers push gradients and pull weights."""

    num_shards: Annotated[int, Field(ge=1, le=256, description="Number of shard actors.")] = 2
    consistency: Annotated[Consistency, Field(description="sync | async | ssp.")] = Consistency.SYNC
    staleness: Annotated[
        int, Field(ge=0, le=1000, description="ssp: how many steps a worker may run ahead.")
    ] = 2
    cpus_per_shard: Annotated[
        float, Field(ge=0.0, le=64, description="CPUs Ray reserves for each shard actor.")
    ] = 0.0


class LargeBatchSpec(_Section):
    """Helpers for training with large global batches."""

    accumulation_steps: Annotated[
        int, Field(ge=1, le=4096, description="Micro-batches summed into one optimizer step.")
    ] = 1
    lr_scaling: Annotated[LrScaling, Field(description="none | linear.")] = LrScaling.NONE
    reference_batch_size: Annotated[
        int, Field(ge=1, description="Batch size the base learning rate was tuned for.")
    ] = 256
    warmup_steps: Annotated[
        int, Field(ge=0, description="Ramp the lr linearly from base to scaled over these.")
    ] = 0
    optimizer: Annotated[OptimizerName, Field(description="sgd | adamw | lars | lamb.")] = (
        OptimizerName.SGD
    )


class MemorySpec(_Section):
    """Trade compute for memory, or shard the model over the ranks."""

    precision: Annotated[Precision, Field(description="fp32 | bf16 | fp16 (GPU only).")] = (
        Precision.FP32
    )
    activation_checkpointing: Annotated[
        bool, Field(description="Recompute block activations in backward instead of storing them.")
    ] = False
    fsdp: Annotated[
        bool, Field(description="Shard parameters, gradients and optimizer state (FSDP2).")
    ] = False


class DistributedSpec(_Section):
    """How the ranks of a trial exchange gradients, and memory/large-batch options."""

    strategy: Annotated[Strategy, Field(description="Communication strategy.")] = Strategy.ALLREDUCE
    bucket_cap_mb: Annotated[
        float, Field(gt=0.0, le=1024.0, description="DDP gradient bucket size, in MiB.")
    ] = 25.0
    find_unused_parameters: Annotated[
        bool, Field(description="DDP: allow parameters that get no gradient in a step.")
    ] = False
    powersgd: Annotated[PowerSGDSpec, Field(description="Options of strategy powersgd.")] = (
        PowerSGDSpec()
    )
    onebit: Annotated[OneBitSpec, Field(description="Options of strategy onebit.")] = OneBitSpec()
    topk: Annotated[TopKSpec, Field(description="Options of strategy topk.")] = TopKSpec()
    localsgd: Annotated[LocalSGDSpec, Field(description="Options of strategy localsgd.")] = (
        LocalSGDSpec()
    )
    ps: Annotated[ParameterServerSpec, Field(description="Options of strategy ps.")] = (
        ParameterServerSpec()
    )
    large_batch: Annotated[
        LargeBatchSpec, Field(description="Gradient accumulation, lr scaling, optimizer.")
    ] = LargeBatchSpec()
    memory: Annotated[
        MemorySpec, Field(description="Mixed precision, activation checkpointing, FSDP.")
    ] = MemorySpec()

    @model_validator(mode="after")
    def _compatible(self) -> DistributedSpec:
        if self.memory.fsdp and self.strategy is not Strategy.ALLREDUCE:
            raise ValueError(
                f"memory.fsdp shards gradients with reduce-scatter and cannot be combined with "
                f"strategy {self.strategy.value!r}; use strategy 'allreduce' with fsdp"
            )
        if self.strategy is Strategy.PS and self.large_batch.optimizer is not OptimizerName.SGD:
            raise ValueError(
                "strategy 'ps' applies SGD on the parameter shards; set large_batch.optimizer "
                "to 'sgd'"
            )
        return self
