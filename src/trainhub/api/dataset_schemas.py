"""Bodies of the dataset routes (``/api/v1/datasets``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from trainhub.core.dataset_spec import DATASET_NAME_PATTERN, SHA256_PATTERN
from trainhub.service.datasets import Dataset, DatasetVersion, MountedVersion, PushResult


class DatasetFromContent(BaseModel):
    """A new version from content the tenant pushed before (no upload)."""

    model_config = ConfigDict(extra="forbid")
    sha256: Annotated[str, Field(pattern=SHA256_PATTERN)]
    tenant: Annotated[str | None, Field(min_length=1, max_length=64)] = None


class DatasetVersionPublic(BaseModel):
    dataset: str
    tenant: str
    version: int
    ref: str = Field(description="TENANT/NAME:VERSION; a spec's data list names it.")
    sha256: str
    size_bytes: int
    created_at: float
    created_by: str

    @classmethod
    def of(cls, v: DatasetVersion) -> DatasetVersionPublic:
        return cls(
            dataset=v.dataset,
            tenant=v.tenant,
            version=v.version,
            ref=v.ref,
            sha256=v.sha256,
            size_bytes=v.size_bytes,
            created_at=v.created_at,
            created_by=v.created_by,
        )


class DatasetPushed(DatasetVersionPublic):
    stored_bytes: int = Field(description="Bytes stored by this push; 0 for known content.")

    @classmethod
    def of_push(cls, result: PushResult) -> DatasetPushed:
        base = DatasetVersionPublic.of(result.version).model_dump()
        return cls(**base, stored_bytes=result.stored_bytes)


class DatasetPublic(BaseModel):
    name: Annotated[str, Field(pattern=DATASET_NAME_PATTERN)]
    tenant: str
    created_at: float
    created_by: str
    shared_with: list[str]
    latest: DatasetVersionPublic | None
    versions: list[DatasetVersionPublic]

    @classmethod
    def of(cls, d: Dataset) -> DatasetPublic:
        latest = d.latest
        return cls(
            name=d.name,
            tenant=d.tenant,
            created_at=d.created_at,
            created_by=d.created_by,
            shared_with=list(d.shared_with),
            latest=DatasetVersionPublic.of(latest) if latest else None,
            versions=[DatasetVersionPublic.of(v) for v in d.versions],
        )


class DatasetsPublic(BaseModel):
    data: list[DatasetPublic]
    count: int


class RemovedPublic(BaseModel):
    removed: list[str]


class TrialDatasetPublic(BaseModel):
    index: int
    ref: str
    mount: str
    sha256: str
    size_bytes: int

    @classmethod
    def of(cls, m: MountedVersion) -> TrialDatasetPublic:
        return cls(
            index=m.index, ref=m.ref, mount=m.mount, sha256=m.sha256, size_bytes=m.size_bytes
        )


class TrialDatasetsPublic(BaseModel):
    data: list[TrialDatasetPublic]
    count: int
