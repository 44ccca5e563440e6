"""Bodies of the model registry routes (``/api/v1/models``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from trainhub.core import limits
from trainhub.core.model_spec import MODEL_NAME_PATTERN, ArchSpec
from trainhub.service.registry import ModelVersion, RegisteredModel


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


_Scalar = str | int | float | bool | None


class ModelRegister(_In):
    """Register a checkpoint of a trial as the next version of model ``name``."""

    trial_id: Annotated[int, Field(ge=1, le=limits.INT64_MAX)]
    name: Annotated[str, Field(pattern=MODEL_NAME_PATTERN)]
    checkpoint_id: Annotated[int | None, Field(ge=1, le=limits.INT64_MAX)] = Field(
        None, description="Default: the trial's latest checkpoint."
    )
    description: str = Field("", max_length=limits.MAX_MODEL_DESCRIPTION_CHARS)
    arch: ArchSpec | None = Field(None, description="Default: the trial spec's model.arch.")
    metrics: dict[Annotated[str, Field(pattern=limits.METRIC_NAME_PATTERN)], float] = Field(
        default_factory=dict, max_length=limits.MAX_METRICS_PER_POINT
    )
    lineage: dict[Annotated[str, Field(max_length=64)], _Scalar] = Field(
        default_factory=dict, max_length=32
    )


class ModelVersionPublic(BaseModel):
    model: str
    tenant: str
    version: int
    ref: str = Field(description="TENANT/NAME:VERSION, what model.init_from takes.")
    size_bytes: int
    arch: dict[str, Any]
    metrics: dict[str, Any]
    hparams: dict[str, Any]
    lineage: dict[str, Any]
    created_at: float
    created_by: str
    weights_fit: bool | None = Field(
        None,
        description="Whether the weights load into arch: null where not checked (no zoo "
        "architecture, or registered before registration checked it and not re-checked yet).",
    )
    weights_problem: str = Field("", description="What does not fit, when weights_fit is false.")

    @classmethod
    def of(cls, v: ModelVersion) -> ModelVersionPublic:
        return cls(
            model=v.model,
            tenant=v.tenant,
            version=v.version,
            ref=v.ref,
            size_bytes=v.size_bytes,
            arch=v.arch,
            metrics=v.metrics,
            hparams=v.hparams,
            lineage=v.lineage,
            created_at=v.created_at,
            created_by=v.created_by,
            weights_fit=v.weights_fit,
            weights_problem=v.weights_problem,
        )


class ModelVersionsPublic(BaseModel):
    data: list[ModelVersionPublic]
    count: int


class ModelPublic(BaseModel):
    name: str
    tenant: str
    description: str
    created_at: float
    created_by: str
    shared_with: list[str]
    latest: ModelVersionPublic | None
    versions: list[ModelVersionPublic]

    @classmethod
    def of(cls, m: RegisteredModel) -> ModelPublic:
        latest = m.latest
        return cls(
            name=m.name,
            tenant=m.tenant,
            description=m.description,
            created_at=m.created_at,
            created_by=m.created_by,
            shared_with=list(m.shared_with),
            latest=ModelVersionPublic.of(latest) if latest else None,
            versions=[ModelVersionPublic.of(v) for v in m.versions],
        )


class ModelsPublic(BaseModel):
    data: list[ModelPublic]
    count: int
