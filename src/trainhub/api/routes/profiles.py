"""Profiles of running trials: users ask for one and read the per-rank tables and traces; the
trial's runtime (its own token) polls for a request and uploads each rank's result."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.params import TrialId, errors
from trainhub.core import limits
from trainhub.core.errors import Conflict, TooLarge
from trainhub.service.container import Services
from trainhub.service.profiling import Profile, ProfilingService

router = APIRouter(prefix="/trials", tags=["profiles"])

ProfileId = Annotated[int, Path(ge=1, le=limits.INT64_MAX, description="A profile id.")]
Rank = Annotated[int, Path(ge=0, le=1_000_000)]


class ProfileIn(BaseModel):
    model_config = {"extra": "forbid"}
    steps: int = Field(20, ge=1, le=limits.MAX_PROFILE_STEPS, description="Steps to profile.")


class OperatorPublic(BaseModel):
    name: str = Field(max_length=limits.MAX_PROFILE_OP_NAME_CHARS)
    calls: int = Field(0, ge=0, le=limits.INT64_MAX)
    self_cpu_ms: float | None = Field(None, ge=0, le=1e12)
    cpu_total_ms: float | None = Field(None, ge=0, le=1e12)
    self_device_ms: float | None = Field(None, ge=0, le=1e12)
    device_total_ms: float | None = Field(None, ge=0, le=1e12)


class RankTableIn(BaseModel):
    model_config = {"extra": "forbid"}
    top_ops: list[OperatorPublic] = Field(max_length=limits.MAX_PROFILE_OPS)


class RankProfilePublic(BaseModel):
    rank: int
    top_ops: list[OperatorPublic]
    trace_bytes: int
    has_trace: bool


class ProfilePublic(BaseModel):
    id: int
    trial_id: int
    steps: int
    state: str
    requested_by: str
    requested_at: float
    attempt: int
    world_size: int
    detail: str
    ranks: list[RankProfilePublic]

    @classmethod
    def of(cls, p: Profile) -> ProfilePublic:
        return cls(
            id=p.id,
            trial_id=p.trial_id,
            steps=p.steps,
            state=p.state.value,
            requested_by=p.requested_by,
            requested_at=p.requested_at,
            attempt=p.attempt,
            world_size=p.world_size,
            detail=p.detail,
            ranks=[
                RankProfilePublic(
                    rank=r.rank,
                    top_ops=[OperatorPublic(**op) for op in r.top_ops],
                    trace_bytes=r.trace_bytes,
                    has_trace=r.trace_key is not None,
                )
                for r in p.ranks
            ],
        )


class ProfilesPublic(BaseModel):
    data: list[ProfilePublic]
    count: int


class PendingPublic(BaseModel):
    profile: ProfilePublic | None = Field(description="The open profile the ranks should run")


def profiling(services: Services) -> ProfilingService:
    if services.profiling is None:
        raise Conflict("profiling is off on this control plane", "start it with trainhub server")
    return services.profiling


@router.post(
    "/{trial_id}/profiles",
    status_code=201,
    response_model=ProfilePublic,
    responses=errors(404, 409),
)
def request_profile(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId, body: ProfileIn
) -> ProfilePublic:
    """Profile the running trial's next ``steps`` steps on every rank (torch.profiler)."""
    return ProfilePublic.of(profiling(services).request(principal, trial_id, body.steps))


@router.get("/{trial_id}/profiles", response_model=ProfilesPublic, responses=errors(404))
def list_profiles(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> ProfilesPublic:
    rows = profiling(services).list_profiles(principal, trial_id)
    return ProfilesPublic(data=[ProfilePublic.of(p) for p in rows], count=len(rows))


@router.get("/{trial_id}/profiles/pending", response_model=PendingPublic, responses=errors(404))
def pending_profile(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> PendingPublic:
    """What the trial's ranks poll: the open profile, if any."""
    found = profiling(services).pending(principal, trial_id)
    return PendingPublic(profile=ProfilePublic.of(found) if found else None)


@router.get(
    "/{trial_id}/profiles/{profile_id}", response_model=ProfilePublic, responses=errors(404)
)
def get_profile(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId, profile_id: ProfileId
) -> ProfilePublic:
    """The profile with each rank's top operators by time."""
    return ProfilePublic.of(profiling(services).get(principal, trial_id, profile_id))


@router.post(
    "/{trial_id}/profiles/{profile_id}/ranks/{rank}",
    response_model=ProfilePublic,
    responses=errors(403, 404, 409),
)
def upload_rank_table(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    profile_id: ProfileId,
    rank: Rank,
    body: RankTableIn,
) -> ProfilePublic:
    """One rank's top operators (the trial's own runtime)."""
    ops: list[dict[str, Any]] = [op.model_dump(exclude_none=True) for op in body.top_ops]
    return ProfilePublic.of(
        profiling(services).upload(principal, trial_id, profile_id, rank, ops, None)
    )


@router.put(
    "/{trial_id}/profiles/{profile_id}/ranks/{rank}/trace",
    response_model=ProfilePublic,
    responses=errors(403, 404, 409, 413),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def upload_rank_trace(
    request: Request,
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    profile_id: ProfileId,
    rank: Rank,
) -> ProfilePublic:
    """One rank's Chrome trace, gzip-compressed, as the raw body (the trial's own runtime),
    sent after its table."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.MAX_PROFILE_TRACE_BYTES:
            raise TooLarge(f"the trace is over {limits.MAX_PROFILE_TRACE_BYTES} bytes")
        chunks.append(chunk)
    service = profiling(services)
    current = await run_in_threadpool(service.get, principal, trial_id, profile_id)
    ops = next((r.top_ops for r in current.ranks if r.rank == rank), [])
    updated = await run_in_threadpool(
        service.upload, principal, trial_id, profile_id, rank, ops, b"".join(chunks)
    )
    return ProfilePublic.of(updated)


@router.get(
    "/{trial_id}/profiles/{profile_id}/ranks/{rank}/trace",
    responses={**errors(404), 200: {"content": {"application/gzip": {}}}},
)
def download_trace(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    profile_id: ProfileId,
    rank: Rank,
) -> Response:
    """One rank's trace: a gzip-compressed Chrome trace (open it in https://ui.perfetto.dev)."""
    data = profiling(services).trace(principal, trial_id, profile_id, rank)
    name = f"trial{trial_id}-profile{profile_id}-rank{rank}.trace.json.gz"
    return Response(
        data,
        media_type="application/gzip",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )
