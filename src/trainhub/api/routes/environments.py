"""Trial environments: the cache's listing (``trainhub envs``), an admin's removal, and the
environment of one trial with its build log (``trainhub logs TRIAL --env``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field

from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.params import TrialId, errors
from trainhub.core.errors import Conflict
from trainhub.service.container import Services
from trainhub.service.environments import EnvironmentRecord, EnvironmentService

router = APIRouter(tags=["environments"])

EnvironmentKey = Annotated[
    str,
    Path(
        min_length=6,
        max_length=64,
        pattern=r"^[0-9a-fA-F]+$",
        description="An environment's key, or its first digits (at least 6).",
    ),
]


class EnvironmentPublic(BaseModel):
    key: str | None = Field(description="Content address: hash of lock, Python and base")
    request_key: str
    state: str
    requirements: list[str]
    packages: list[str] = Field(description="The pins installed over the base")
    size_bytes: int
    created_at: float
    built_at: float | None
    last_used_at: float | None
    num_builds: int
    num_uses: int
    nodes: list[str]
    build_s: float | None
    error: str

    @classmethod
    def of(cls, r: EnvironmentRecord) -> EnvironmentPublic:
        return cls(
            key=r.key,
            request_key=r.request_key,
            state=r.state.value,
            requirements=r.requirements,
            packages=r.packages,
            size_bytes=r.size_bytes,
            created_at=r.created_at,
            built_at=r.built_at,
            last_used_at=r.last_used_at,
            num_builds=r.num_builds,
            num_uses=r.num_uses,
            nodes=r.nodes,
            build_s=r.build_s,
            error=r.error,
        )


class EnvironmentsPublic(BaseModel):
    data: list[EnvironmentPublic]
    count: int


class EnvironmentLogPublic(EnvironmentPublic):
    build_log: str


def environments(services: Services) -> EnvironmentService:
    if services.environments is None:
        raise Conflict("this control plane builds no environments", "start it with trainhub server")
    return services.environments


@router.get("/environments", response_model=EnvironmentsPublic, responses=errors(403, 409))
def list_environments(services: ServicesDep, principal: CurrentPrincipal) -> EnvironmentsPublic:
    """The cached environments (admins: all; others: those their tenants' experiments use)."""
    rows = environments(services).list_environments(principal)
    return EnvironmentsPublic(data=[EnvironmentPublic.of(r) for r in rows], count=len(rows))


@router.delete(
    "/environments/{key}", response_model=EnvironmentsPublic, responses=errors(403, 404, 409)
)
def remove_environment(
    services: ServicesDep, principal: CurrentPrincipal, key: EnvironmentKey
) -> EnvironmentsPublic:
    """Remove a cached environment (admins); refused while a queued or running trial needs it."""
    rows = environments(services).remove(principal, key)
    return EnvironmentsPublic(data=[EnvironmentPublic.of(r) for r in rows], count=len(rows))


@router.get(
    "/trials/{trial_id}/environment",
    response_model=EnvironmentLogPublic,
    responses=errors(404, 409),
)
def trial_environment(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> EnvironmentLogPublic:
    """The environment a trial runs in, with its build log."""
    record = environments(services).of_trial(principal, trial_id)
    public = EnvironmentPublic.of(record)
    return EnvironmentLogPublic(**public.model_dump(), build_log=record.build_log)
