"""A rank's checkpoints straight to and from the bucket, with presigned URLs (ADR 0033).

Each answer says the route: ``direct`` with the URLs, or ``control-plane`` (the server stores
through itself, ``--rank-storage control-plane``, or on a folder): the rank then uses
``POST /trials/{id}/checkpoints`` and ``GET .../checkpoints/{cid}/file`` as before.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.params import CheckpointId, TrialId, errors
from trainhub.api.schemas import CheckpointPublic
from trainhub.core.limits import INT64_MAX
from trainhub.service.container import Services
from trainhub.service.direct_checkpoints import CheckpointMeta, DirectCheckpoints
from trainhub.service.ports import DirectUpload
from trainhub.service.records import Checkpoint

router = APIRouter(prefix="/trials", tags=["trials"])


def _direct(services: Services) -> DirectCheckpoints:
    """The server's presigned transfers, or the control plane's route only (the checks of
    both routes run either way)."""
    return services.direct_checkpoints or DirectCheckpoints(
        services.tracking, services.tracking.store
    )


class DirectCheckpointBody(BaseModel):
    """A checkpoint a rank saves: the query of ``POST .../checkpoints``, and its size."""

    model_config = ConfigDict(extra="forbid")

    uuid: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    step: int = Field(ge=0, le=INT64_MAX)
    attempt: int = Field(1, ge=1, le=INT64_MAX)
    metrics: dict[str, Any] = Field(default_factory=dict, max_length=256)
    size_bytes: int = Field(ge=0, le=INT64_MAX)

    def meta(self) -> CheckpointMeta:
        return CheckpointMeta(self.uuid, self.step, self.attempt, self.metrics, self.size_bytes)


class CompleteBody(DirectCheckpointBody):
    upload_id: str = Field(min_length=1, max_length=1024)


class DirectUploadPublic(BaseModel):
    route: Literal["direct", "control-plane", "stored"]
    upload_id: str | None = None
    part_bytes: int | None = None
    urls: list[str] = Field(default_factory=list, description="Part i+1's PUT URL at [i].")
    stored: dict[int, str] = Field(
        default_factory=dict, description="Parts stored by an earlier try: number -> ETag."
    )
    expires_in_s: int | None = None
    checkpoint: CheckpointPublic | None = Field(
        None, description="Route 'stored': this uuid is registered already (a retry)."
    )

    @classmethod
    def direct(cls, found: DirectUpload) -> DirectUploadPublic:
        """Route ``direct``: the signed part URLs of ``found``."""
        return cls(
            route="direct",
            upload_id=found.upload_id,
            part_bytes=found.part_bytes,
            urls=list(found.urls),
            stored=dict(found.stored),
            expires_in_s=found.expires_s,
        )


class DirectDownloadPublic(BaseModel):
    route: Literal["direct", "control-plane"]
    url: str | None = None
    size_bytes: int | None = None
    expires_in_s: int | None = None


@router.post(
    "/{trial_id}/checkpoints/direct",
    response_model=DirectUploadPublic,
    responses=errors(404, 409),
)
async def begin_direct_checkpoint(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    body: DirectCheckpointBody,
) -> DirectUploadPublic:
    """Presigned PUT URLs for the checkpoint's parts (the trial's own token; quotas checked
    against ``size_bytes`` first). Asking again refreshes expired URLs and lists the parts an
    earlier try stored."""
    direct = _direct(services)
    found = await run_in_threadpool(direct.begin_upload, principal, trial_id, body.meta())
    if found is None:
        return DirectUploadPublic(route="control-plane")
    if isinstance(found, Checkpoint):
        return DirectUploadPublic(route="stored", checkpoint=CheckpointPublic.of(found))
    return DirectUploadPublic.direct(found)


@router.post(
    "/{trial_id}/checkpoints/direct/complete",
    status_code=201,
    response_model=CheckpointPublic,
    responses=errors(404, 409),
)
async def complete_direct_checkpoint(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    body: CompleteBody,
) -> CheckpointPublic:
    """Publish the parts the rank sent and register the checkpoint (sizes and quotas checked
    again; refused parts are dropped). Retrying with the same uuid is safe."""
    checkpoint = await run_in_threadpool(
        _direct(services).complete_upload, principal, trial_id, body.meta(), body.upload_id
    )
    return CheckpointPublic.of(checkpoint)


@router.get(
    "/{trial_id}/checkpoints/{checkpoint_id}/direct",
    response_model=DirectDownloadPublic,
    responses=errors(404),
)
def direct_checkpoint_download(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    checkpoint_id: CheckpointId,
) -> DirectDownloadPublic:
    """A presigned GET URL of a checkpoint the trial may restore (ranged reads allowed)."""
    found = _direct(services).download(principal, trial_id, checkpoint_id)
    if found is None:
        return DirectDownloadPublic(route="control-plane")
    return DirectDownloadPublic(
        route="direct", url=found.url, size_bytes=found.size, expires_in_s=found.expires_s
    )
