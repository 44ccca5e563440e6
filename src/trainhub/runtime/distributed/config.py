"""The runtime's view of the spec's ``distributed`` section: frozen dataclasses, no torch.

The control plane validates the section with ``trainhub.core.distributed_spec.DistributedSpec``
(pydantic) and hands its JSON to every rank in ``TRAINHUB_DISTRIBUTED``. The runtime may not
import the core (layering), so it parses that JSON here into :class:`DistributedConfig`, which
checks the same rules in ``__post_init__`` (a test round-trips one into the other). Scripts run
outside trainhub (plain ``torchrun``) get the defaults.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_args, get_origin

ENV_DISTRIBUTED = "TRAINHUB_DISTRIBUTED"  # same name as trainhub.runtime.protocol

StrategyName = Literal["allreduce", "fp16", "bf16", "powersgd", "onebit", "topk", "localsgd", "ps"]
ConsistencyName = Literal["sync", "async", "ssp"]
PrecisionName = Literal["fp32", "bf16", "fp16"]
OptimizerKind = Literal["sgd", "adamw", "lars", "lamb"]
LrScalingName = Literal["none", "linear"]

DDP_STRATEGIES = frozenset({"allreduce", "fp16", "bf16", "powersgd", "onebit", "topk", "localsgd"})


def _check(condition: bool, path: str, message: str) -> None:
    if not condition:
        raise ValueError(f"distributed.{path}: {message}")


def _check_choice(value: object, choices: Any, path: str) -> None:
    allowed = get_args(choices)
    _check(value in allowed, path, f"must be one of {', '.join(map(str, allowed))}; got {value!r}")


@dataclass(frozen=True)
class PowerSGDConfig:
    rank: int = 2
    start_step: int = 10
    min_compression_rate: float = 2.0
    error_feedback: bool = True
    warm_start: bool = True

    def __post_init__(self) -> None:
        _check(1 <= self.rank <= 64, "powersgd.rank", "must be in 1..64")
        _check(self.start_step >= 1, "powersgd.start_step", "must be >= 1")
        _check(self.min_compression_rate >= 1.0, "powersgd.min_compression_rate", "must be >= 1")
        _check(
            not ((self.error_feedback or self.warm_start) and self.start_step < 2),
            "powersgd.start_step",
            "must be >= 2 when error_feedback or warm_start is on "
            "(DDP rebuilds its buckets after the first step)",
        )


@dataclass(frozen=True)
class OneBitConfig:
    start_step: int = 10
    error_feedback: bool = True

    def __post_init__(self) -> None:
        _check(self.start_step >= 1, "onebit.start_step", "must be >= 1")


@dataclass(frozen=True)
class TopKConfig:
    density: float = 0.01
    warmup_steps: int = 100
    start_step: int = 1
    error_feedback: bool = True

    def __post_init__(self) -> None:
        _check(0.0 < self.density <= 1.0, "topk.density", "must be in (0, 1]")
        _check(self.warmup_steps >= 0, "topk.warmup_steps", "must be >= 0")
        _check(self.start_step >= 1, "topk.start_step", "must be >= 1")


@dataclass(frozen=True)
class LocalSGDConfig:
    period: int = 8
    start_step: int = 100
    overlap: bool = False

    def __post_init__(self) -> None:
        _check(2 <= self.period <= 10_000, "localsgd.period", "must be in 2..10000")
        _check(self.start_step >= 0, "localsgd.start_step", "must be >= 0")


@dataclass(frozen=True)
class ParameterServerConfig:
    num_shards: int = 2
    consistency: ConsistencyName = "sync"
    staleness: int = 2
    cpus_per_shard: float = 0.0

    def __post_init__(self) -> None:
        _check(1 <= self.num_shards <= 256, "ps.num_shards", "must be in 1..256")
        _check_choice(self.consistency, ConsistencyName, "ps.consistency")
        _check(0 <= self.staleness <= 1000, "ps.staleness", "must be in 0..1000")
        _check(0.0 <= self.cpus_per_shard <= 64, "ps.cpus_per_shard", "must be in 0..64")


@dataclass(frozen=True)
class LargeBatchConfig:
    accumulation_steps: int = 1
    lr_scaling: LrScalingName = "none"
    reference_batch_size: int = 256
    warmup_steps: int = 0
    optimizer: OptimizerKind = "sgd"

    def __post_init__(self) -> None:
        _check(1 <= self.accumulation_steps <= 4096, "large_batch.accumulation_steps", "in 1..4096")
        _check_choice(self.lr_scaling, LrScalingName, "large_batch.lr_scaling")
        _check(self.reference_batch_size >= 1, "large_batch.reference_batch_size", "must be >= 1")
        _check(self.warmup_steps >= 0, "large_batch.warmup_steps", "must be >= 0")
        _check_choice(self.optimizer, OptimizerKind, "large_batch.optimizer")


@dataclass(frozen=True)
class MemoryConfig:
    precision: PrecisionName = "fp32"
    activation_checkpointing: bool = False
    fsdp: bool = False

    def __post_init__(self) -> None:
        _check_choice(self.precision, PrecisionName, "memory.precision")


@dataclass(frozen=True)
class DistributedConfig:
    """What the runtime applies to a trial's model and optimizer (see docs/distributed.md)."""

    strategy: StrategyName = "allreduce"
    bucket_cap_mb: float = 25.0
    find_unused_parameters: bool = False
    powersgd: PowerSGDConfig = field(default_factory=PowerSGDConfig)
    onebit: OneBitConfig = field(default_factory=OneBitConfig)
    topk: TopKConfig = field(default_factory=TopKConfig)
    localsgd: LocalSGDConfig = field(default_factory=LocalSGDConfig)
    ps: ParameterServerConfig = field(default_factory=ParameterServerConfig)
    large_batch: LargeBatchConfig = field(default_factory=LargeBatchConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)

    def __post_init__(self) -> None:
        _check_choice(self.strategy, StrategyName, "strategy")
        _check(0.0 < self.bucket_cap_mb <= 1024.0, "bucket_cap_mb", "must be in (0, 1024]")
        _check(
            not (self.memory.fsdp and self.strategy != "allreduce"),
            "memory.fsdp",
            f"shards gradients with reduce-scatter and cannot be combined with strategy "
            f"{self.strategy!r}; use strategy 'allreduce' with fsdp",
        )
        _check(
            not (self.strategy == "ps" and self.large_batch.optimizer != "sgd"),
            "large_batch.optimizer",
            "strategy 'ps' applies SGD on the parameter shards; set it to 'sgd'",
        )

    @property
    def uses_ddp(self) -> bool:
        return self.strategy in DDP_STRATEGIES and not self.memory.fsdp

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> DistributedConfig:
        """Build from the parsed JSON/YAML of the section; unknown keys are errors."""
        return _build(cls, data, "")

    @classmethod
    def from_json(cls, text: str) -> DistributedConfig:
        data = json.loads(text) if text.strip() else {}
        if data is None:
            data = {}
        _check(isinstance(data, dict), "", "the section must be a JSON object")
        return cls.from_mapping(data)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DistributedConfig:
        """The section the control plane put in ``TRAINHUB_DISTRIBUTED``; defaults if unset."""
        env = os.environ if environ is None else environ
        return cls.from_json(env.get(ENV_DISTRIBUTED, ""))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_T = TypeVar("_T")


def _build(cls: type[_T], data: Mapping[str, Any], prefix: str) -> _T:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    _check(
        not unknown,
        prefix + (unknown[0] if unknown else ""),
        f"unknown field; known fields here: {', '.join(sorted(names))}",
    )
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        kwargs[name] = _coerce(hints[name], value, prefix + name)
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, path: str) -> Any:
    if dataclasses.is_dataclass(hint):
        _check(isinstance(value, Mapping), path, "must be a mapping")
        return _build(hint, value, path + ".")  # type: ignore[arg-type]
    if get_origin(hint) is Literal:
        _check_choice(value, hint, path)
        return value
    if hint is bool:
        _check(isinstance(value, bool), path, f"must be true or false; got {value!r}")
        return value
    if hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        ok = ok or (isinstance(value, float) and value.is_integer())
        _check(ok, path, f"must be an integer; got {value!r}")
        return int(value)
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        _check(ok, path, f"must be a number; got {value!r}")
        return float(value)
    if isinstance(hint, types.UnionType):  # pragma: no cover - no optional fields today
        return value
    raise AssertionError(f"unhandled field type {hint!r} at {path}")
