"""The ``distributed`` section of the experiment spec, written once for both sides.

A leaf module (pydantic only; no torch, no other trainhub import) shared by the control plane
and the runtime: ``trainhub.core.spec`` validates a submitted spec with :class:`DistributedSpec`,
and every rank parses the JSON it finds in ``TRAINHUB_DISTRIBUTED`` with the same class
(:meth:`DistributedSpec.from_mapping`, whose errors name the field path). Each communication
strategy owns one nested config (``powersgd``, ``onebit``, ...); the runtime's registry of
``BaseCommStrategy`` classes is checked against :data:`STRATEGY_CONFIGS` so a strategy cannot
exist on one side only.

```yaml
distributed:
  strategy: powersgd          # allreduce | fp16 | bf16 | powersgd | onebit | topk | localsgd | ps
  bucket_cap_mb: 25
  powersgd: {rank: 4, start_step: 10}
  memory: {precision: bf16}
```
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

ENV_DISTRIBUTED = "TRAINHUB_DISTRIBUTED"  # the same name as trainhub.runtime.protocol's


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
    PS = "ps"  # parameter server: shards inside the ranks, push gradients / pull weights


PS_OPTIMIZERS = frozenset({"sgd", "adamw"})  # what the parameter shards implement


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
    """Sign of each gradient entry (1 bit) and one scale (mean |g|) per block of entries."""

    block_size: Annotated[
        int,
        Field(
            ge=8,
            le=1 << 24,
            description="Entries of a tensor that share one scale; 4 bytes per block ride "
            "with the signs (256: 28x less than fp32).",
        ),
    ] = 256

    start_step: Annotated[
        int, Field(ge=1, description="Plain all-reduce before this step (warm-up).")
    ] = 10
    error_feedback: Annotated[
        bool, Field(description="Carry what the signs lost to the next step.")
    ] = True
    momentum_correction: Annotated[
        bool,
        Field(
            description="Compress each rank's momentum velocity instead of its gradient; the "
            "SGD optimizer given to prepare_optimizer keeps its momentum value but applies none "
            "itself (Deep Gradient Compression's momentum correction)."
        ),
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
    momentum_correction: Annotated[
        bool,
        Field(
            description="Compress each rank's momentum velocity instead of its gradient; the "
            "SGD optimizer given to prepare_optimizer keeps its momentum value but applies none "
            "itself (Deep Gradient Compression's momentum correction). Off by default: it cost "
            "accuracy in docs/distributed.md's measurements."
        ),
    ] = False


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
    """Parameter shards hosted by the trial's own ranks; workers push gradients, pull weights."""

    num_shards: Annotated[
        int,
        Field(
            ge=1,
            le=256,
            description="Number of shards; shard i lives in rank i mod world size (a server "
            "thread of that rank's process, so shards are placed and counted with the trial).",
        ),
    ] = 2
    consistency: Annotated[Consistency, Field(description="sync | async | ssp.")] = Consistency.SYNC
    staleness: Annotated[
        int, Field(ge=0, le=1000, description="ssp: how many steps a worker may run ahead.")
    ] = 2


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


class PipelineSchedule(StrEnum):
    """The pipeline schedules offered (both tested on gloo; looped schedules are not)."""

    GPIPE = "gpipe"  # every micro-batch forward, then every backward (all activations held)
    ONE_F_ONE_B = "1f1b"  # one forward, one backward in the steady state (<= stages held)


class PipelineSpec(_Section):
    """Pipeline parallelism: the model split into consecutive stages, micro-batches flowing
    through them (torch.distributed.pipelining)."""

    stages: Annotated[
        int, Field(ge=1, le=64, description="Consecutive parts of the model, one per rank.")
    ] = 2
    microbatches: Annotated[
        int,
        Field(
            ge=1,
            le=4096,
            description="Micro-batches each batch is cut into; the per-rank batch must divide "
            "by it. The bubble (idle) fraction is about (stages-1)/(microbatches+stages-1).",
        ),
    ] = 8
    schedule: Annotated[PipelineSchedule, Field(description="gpipe | 1f1b.")] = (
        PipelineSchedule.ONE_F_ONE_B
    )
    split_points: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=200)]] | None,
        Field(
            max_length=63,
            description="Names of the layers each stage after the first starts at (e.g. "
            "blocks.2), stages - 1 of them; default: stages of about equal parameter count.",
        ),
    ] = None

    @model_validator(mode="after")
    def _consistent(self) -> PipelineSpec:
        if self.schedule is PipelineSchedule.ONE_F_ONE_B and self.microbatches < self.stages:
            raise ValueError(
                f"microbatches: schedule '1f1b' needs at least as many micro-batches as stages "
                f"({self.stages}); got {self.microbatches}"
            )
        if self.split_points is not None and len(self.split_points) != self.stages - 1:
            raise ValueError(
                f"split_points: {self.stages} stages need {self.stages - 1} split point(s); "
                f"got {len(self.split_points)}"
            )
        return self


class DistributedSpec(_Section):
    """How the ranks of a trial exchange gradients, and memory/large-batch options.

    ``pipeline`` and ``tensor`` split the model itself over the ranks (model parallelism): the
    world is ``data x pipeline.stages x tensor`` ranks, the data-parallel degree being what is
    left of it.
    """

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

    pipeline: Annotated[
        PipelineSpec | None,
        Field(description="Pipeline parallelism: stages, micro-batches, schedule."),
    ] = None
    tensor: Annotated[
        int,
        Field(
            ge=1,
            le=64,
            description="Tensor-parallel degree: Linear layers of the model's plan split over "
            "this many ranks of one node (DTensor colwise/rowwise).",
        ),
    ] = 1

    @property
    def model_parallel(self) -> bool:
        """True when the model is split over the ranks (pipeline stages or tensor shards)."""
        return self.tensor > 1 or (self.pipeline is not None and self.pipeline.stages > 1)

    @property
    def model_parallel_size(self) -> int:
        """Ranks one model replica spans: pipeline stages x tensor degree."""
        stages = self.pipeline.stages if self.pipeline is not None else 1
        return stages * self.tensor

    def layout_error(self, world_size: int) -> tuple[str, str] | None:
        """``(field, message)`` when ``world_size`` ranks cannot be cut into ``data x stages x
        tensor``; None when they can."""
        size = self.model_parallel_size
        if world_size % size == 0:
            return None
        stages = self.pipeline.stages if self.pipeline is not None else 1
        field = "tensor" if self.pipeline is None or stages == 1 else "pipeline.stages"
        return (
            field,
            f"{world_size} ranks do not factor into data x pipeline.stages ({stages}) x tensor "
            f"({self.tensor}): the world size must be a multiple of {size}",
        )

    @model_validator(mode="after")
    def _compatible(self) -> DistributedSpec:
        if self.model_parallel and self.memory.fsdp:
            raise ValueError(
                "memory.fsdp: FSDP does not combine with pipeline or tensor parallelism here; "
                "use one or the other"
            )
        if self.model_parallel and self.strategy is not Strategy.ALLREDUCE:
            raise ValueError(
                f"strategy: pipeline and tensor parallelism average the data-parallel gradients "
                f"with a plain all-reduce; strategy {self.strategy.value!r} does not combine with "
                "them (use 'allreduce')"
            )
        if self.memory.fsdp and self.strategy is not Strategy.ALLREDUCE:
            raise ValueError(
                f"memory.fsdp: FSDP shards gradients with reduce-scatter and cannot be combined "
                f"with strategy {self.strategy.value!r}; use strategy 'allreduce' with fsdp"
            )
        if self.strategy is Strategy.PS and self.large_batch.optimizer not in PS_OPTIMIZERS:
            raise ValueError(
                f"large_batch.optimizer: strategy 'ps' runs the optimizer on the parameter shards, "
                f"which implement "
                f"{' and '.join(sorted(PS_OPTIMIZERS))}; set large_batch.optimizer to one of them"
            )
        return self

    @property
    def uses_ddp(self) -> bool:
        """True when the model is wrapped in DDP (every strategy but ``ps``, without FSDP)."""
        return self.strategy is not Strategy.PS and not self.memory.fsdp

    @property
    def strategy_config(self) -> _Section | None:
        """The nested config of the chosen strategy (None for those without options)."""
        key = STRATEGY_CONFIGS[self.strategy.value]
        return None if key is None else getattr(self, key)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> DistributedSpec:
        """Validate the parsed JSON/YAML of the section.

        Raises:
            ValueError: ``distributed.<field path>: <what is wrong>`` for the first problem.
        """
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise ValueError(_first_error(exc)) from None

    @classmethod
    def from_json(cls, text: str) -> DistributedSpec:
        data = json.loads(text) if text.strip() else None
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError("distributed: the section must be a JSON object")
        return cls.from_mapping(data)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DistributedSpec:
        """The section the control plane put in ``TRAINHUB_DISTRIBUTED``; defaults if unset."""
        env = os.environ if environ is None else environ
        return cls.from_json(env.get(ENV_DISTRIBUTED, ""))

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


#: Every strategy name, and the field of :class:`DistributedSpec` holding its own config.
STRATEGY_CONFIGS: dict[str, str | None] = {
    Strategy.ALLREDUCE.value: None,
    Strategy.FP16.value: None,
    Strategy.BF16.value: None,
    Strategy.POWERSGD.value: "powersgd",
    Strategy.ONEBIT.value: "onebit",
    Strategy.TOPK.value: "topk",
    Strategy.LOCALSGD.value: "localsgd",
    Strategy.PS.value: "ps",
}


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    path = ".".join(str(p) for p in err["loc"])
    if not path:  # a rule across fields; its message starts with the field it blames
        return f"distributed.{err['msg'].removeprefix('Value error, ')}"
    where = f"distributed.{path}"
    if err["type"] == "extra_forbidden":
        return f"{where}: unknown field"
    if err["type"] in {"enum", "literal_error"}:
        choices = err["msg"].removeprefix("Input should be ")
        return f"{where}: must be one of {choices}; got {err.get('input')!r}"
    return f"{where}: {err['msg'].removeprefix('Value error, ')}"
