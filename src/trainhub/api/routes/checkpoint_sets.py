"""Sharded checkpoints: each rank uploads its own files, the last report publishes (ADR 0040).

A member's bytes go to ``PUT .../checkpoints/sets/{uuid}/members/{name}`` (the control plane's
route) or straight to the bucket with the URLs of ``POST .../members/{name}/direct`` (then
``.../direct/complete``); the rank then ``POST``s ``.../sets/{uuid}/ranks/{rank}`` with what it
stored. Restores read ``GET .../checkpoints/{cid}/manifest`` and the members a rank needs.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.params import Attempt, CheckpointId, Step, TrialId, errors
from trainhub.api.routes.trial_storage import DirectDownloadPublic, DirectUploadPublic, _direct
from trainhub.api.schemas import CheckpointPublic
from trainhub.core.errors import TooLarge
from trainhub.core.limits import INT64_MAX
from trainhub.service.artifact_sets import SetMember
from trainhub.service.checkpoint_sets import (
    MAX_MEMBERS_PER_RANK,
    MAX_WORLD_SIZE,
    CheckpointSets,
    MemberTarget,
    RankReport,
)
from trainhub.service.container import Services
from trainhub.service.records import Checkpoint

router = APIRouter(prefix="/trials", tags=["trials"])

_WRITE_BYTES = 1 << 20
Uuid = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
MemberName = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")]


def _sets(services: Services) -> CheckpointSets:
    return CheckpointSets(_direct(services))


class MemberPublic(BaseModel):
    name: str
    size_bytes: int
    sha256: str | None = Field(None, description="As the control plane hashed the bytes.")
    checkpoint: CheckpointPublic | None = Field(
        None, description="The set is published already (a retry): nothing was stored."
    )


class DirectMemberBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0, le=INT64_MAX)
    attempt: int = Field(1, ge=1, le=INT64_MAX)
    size_bytes: int = Field(ge=0, le=INT64_MAX)


class CompleteMemberBody(DirectMemberBody):
    upload_id: str = Field(min_length=1, max_length=1024)


class MemberEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    size: int = Field(ge=0, le=INT64_MAX)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class RankReportBody(BaseModel):
    """What one rank stored of the checkpoint."""

    model_config = ConfigDict(extra="forbid")

    world_size: int = Field(ge=1, le=MAX_WORLD_SIZE)
    step: int = Field(ge=0, le=INT64_MAX)
    attempt: int = Field(1, ge=1, le=INT64_MAX)
    metrics: dict[str, Any] = Field(default_factory=dict, max_length=256)
    members: list[MemberEntry] = Field(max_length=MAX_MEMBERS_PER_RANK)


class ReportPublic(BaseModel):
    published: bool
    ranks_reported: int
    world_size: int
    checkpoint: CheckpointPublic | None = None


class ManifestPublic(BaseModel):
    sharded: bool
    checkpoint: CheckpointPublic
    members: list[MemberEntry] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)


@router.put(
    "/{trial_id}/checkpoints/sets/{uuid}/members/{name}",
    status_code=201,
    response_model=MemberPublic,
    responses=errors(404, 409),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def put_member(
    request: Request,
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    uuid: Uuid,
    name: MemberName,
    step: Step,
    attempt: Attempt = 1,
) -> MemberPublic:
    """One file of a sharded checkpoint as the raw body (the trial's own token). Stored whole
    or not at all, invisible until every rank reported; the Content-Length is checked
    against the quotas before the body is read."""
    declared = request.headers.get("content-length")
    size = int(declared) if declared is not None and declared.isdigit() else None
    sets = _sets(services)
    target = await run_in_threadpool(
        sets.target, principal, trial_id, uuid, name, step, attempt, size
    )
    if isinstance(target, Checkpoint):
        return MemberPublic(name=name, size_bytes=0, checkpoint=CheckpointPublic.of(target))
    writer = await run_in_threadpool(sets.open_member_writer, target)
    digest = hashlib.sha256()
    try:
        pending: list[bytes] = []
        pending_bytes = received = 0
        async for chunk in request.stream():
            received += len(chunk)
            if received > target.upload.max_bytes:
                raise TooLarge(
                    f"the checkpoint file is longer than the {target.upload.max_bytes} bytes "
                    "its quotas leave room for",
                    "save a smaller state or ask an admin to raise the storage quotas",
                )
            digest.update(chunk)
            pending.append(chunk)
            pending_bytes += len(chunk)
            if pending_bytes >= _WRITE_BYTES:
                await run_in_threadpool(writer.write, b"".join(pending))
                pending, pending_bytes = [], 0
        if pending:
            await run_in_threadpool(writer.write, b"".join(pending))
        stored = await run_in_threadpool(writer.commit)
    except BaseException:
        await run_in_threadpool(writer.abort)
        raise
    return MemberPublic(name=name, size_bytes=stored, sha256=digest.hexdigest())


@router.post(
    "/{trial_id}/checkpoints/sets/{uuid}/members/{name}/direct",
    response_model=DirectUploadPublic,
    responses=errors(404, 409),
)
def begin_direct_member(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    uuid: Uuid,
    name: MemberName,
    body: DirectMemberBody,
) -> DirectUploadPublic:
    """Presigned part URLs for one file of a sharded checkpoint (``route: direct``), or
    ``route: control-plane`` (PUT the bytes instead), or ``route: stored``."""
    sets = _sets(services)
    target = sets.target(principal, trial_id, uuid, name, body.step, body.attempt, body.size_bytes)
    if isinstance(target, Checkpoint):
        return DirectUploadPublic(route="stored", checkpoint=CheckpointPublic.of(target))
    found = sets.begin_direct_member(target, body.size_bytes)
    if found is None:
        return DirectUploadPublic(route="control-plane")
    return DirectUploadPublic.direct(found)


@router.post(
    "/{trial_id}/checkpoints/sets/{uuid}/members/{name}/direct/complete",
    status_code=201,
    response_model=MemberPublic,
    responses=errors(404, 409),
)
def complete_direct_member(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    uuid: Uuid,
    name: MemberName,
    body: CompleteMemberBody,
) -> MemberPublic:
    """Store the parts the rank sent as the member (checked against ``size_bytes``)."""
    sets = _sets(services)
    target = sets.target(principal, trial_id, uuid, name, body.step, body.attempt, body.size_bytes)
    if isinstance(target, Checkpoint):
        return MemberPublic(name=name, size_bytes=0, checkpoint=CheckpointPublic.of(target))
    assert isinstance(target, MemberTarget)
    size = sets.complete_direct_member(target, body.upload_id, body.size_bytes)
    return MemberPublic(name=name, size_bytes=size)


@router.post(
    "/{trial_id}/checkpoints/sets/{uuid}/ranks/{rank}",
    response_model=ReportPublic,
    responses=errors(404, 409),
)
def report_rank(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    uuid: Uuid,
    rank: Annotated[int, Path(ge=0, le=MAX_WORLD_SIZE)],
    body: RankReportBody,
) -> ReportPublic:
    """What this rank stored; the last rank's report publishes the checkpoint (every member
    checked stored, the quotas checked, the manifest written, the checkpoint registered)."""
    report = RankReport(
        rank,
        body.world_size,
        body.step,
        body.attempt,
        body.metrics,
        tuple(SetMember(m.name, m.size, m.sha256) for m in body.members),
    )
    outcome = _sets(services).report(principal, trial_id, uuid, report)
    return ReportPublic(
        published=outcome.checkpoint is not None,
        ranks_reported=outcome.ranks_reported,
        world_size=outcome.world_size,
        checkpoint=None if outcome.checkpoint is None else CheckpointPublic.of(outcome.checkpoint),
    )


@router.get(
    "/{trial_id}/checkpoints/{checkpoint_id}/manifest",
    response_model=ManifestPublic,
    responses=errors(404),
)
def get_manifest(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    checkpoint_id: CheckpointId,
) -> ManifestPublic:
    """A sharded checkpoint's members (name, size, SHA-256) and what it was saved with
    (``world_size``, each rank's files); ``sharded: false`` for a one-file checkpoint."""
    checkpoint, found = _sets(services).manifest(principal, trial_id, checkpoint_id)
    if found is None:
        return ManifestPublic(sharded=False, checkpoint=CheckpointPublic.of(checkpoint))
    return ManifestPublic(
        sharded=True,
        checkpoint=CheckpointPublic.of(checkpoint),
        members=[MemberEntry(name=m.name, size=m.size, sha256=m.sha256) for m in found.members],
        meta=dict(found.meta),
    )


@router.get(
    "/{trial_id}/checkpoints/{checkpoint_id}/members/{name}",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The file."},
        **errors(404),
    },
)
def get_member(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    checkpoint_id: CheckpointId,
    name: MemberName,
) -> StreamingResponse:
    """One file of a sharded checkpoint, streamed (check it against the manifest's SHA-256:
    a damaged object ends the stream early)."""
    member, chunks = _sets(services).member_chunks(principal, trial_id, checkpoint_id, name)
    return StreamingResponse(
        iterate_in_threadpool(chunks),
        media_type="application/octet-stream",
        headers={"Content-Length": str(member.size)},
    )


@router.get(
    "/{trial_id}/checkpoints/{checkpoint_id}/members/{name}/direct",
    response_model=DirectDownloadPublic,
    responses=errors(404),
)
def get_member_direct(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    checkpoint_id: CheckpointId,
    name: MemberName,
) -> DirectDownloadPublic:
    """A presigned GET URL of one file of a sharded checkpoint, or ``route: control-plane``."""
    found = _sets(services).direct_member(principal, trial_id, checkpoint_id, name)
    if found is None:
        return DirectDownloadPublic(route="control-plane")
    return DirectDownloadPublic(
        route="direct", url=found.url, size_bytes=found.size, expires_in_s=found.expires_s
    )
