"""Interactive sessions: start (``trainhub notebook``/``shell``/``tensorboard``), list, stop;
each tenant's session limits (admins). The session's server is reached through the proxy at
``/ui/sessions/{id}/server/`` (web/session_pages.py), not here."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, status
from pydantic import BaseModel, ConfigDict, Field

from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.params import errors
from trainhub.core import limits
from trainhub.core.errors import Conflict
from trainhub.core.session_spec import (
    MAX_IDLE_TIMEOUT_S,
    MAX_TENSORBOARD_TRIALS,
    MIN_IDLE_TIMEOUT_S,
    SessionKind,
    SessionLimits,
)
from trainhub.service.container import Services
from trainhub.service.sessions import SessionRequest, SessionService, SessionView

router = APIRouter(tags=["sessions"])

SessionId = Annotated[int, Path(ge=1, le=limits.INT64_MAX, description="The session's id.")]
TenantName = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


class SessionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: SessionKind = SessionKind.NOTEBOOK
    gpus: Annotated[int, Field(ge=0, le=16, description="GPUs of the session.")] = 0
    idle_timeout_s: Annotated[float | None, Field(ge=MIN_IDLE_TIMEOUT_S, le=MAX_IDLE_TIMEOUT_S)] = (
        None
    )
    data: list[Annotated[str, Field(min_length=1, max_length=600)]] = Field(
        default_factory=list,
        max_length=limits.MAX_DATA_MOUNTS,
        description="Datasets as NAME:/MOUNT (NAME@VERSION:/MOUNT pins a version).",
    )
    requirements: Annotated[str | None, Field(max_length=limits.MAX_REQUIREMENTS_FILE_BYTES)] = (
        Field(None, description="A requirements file's text: packages over the platform's.")
    )
    trials: list[Annotated[int, Field(ge=1, le=limits.INT64_MAX)]] = Field(
        default_factory=list,
        max_length=MAX_TENSORBOARD_TRIALS,
        description="tensorboard: the trials it shows.",
    )
    tenant: str | None = None
    preemptible: bool = False


class SessionPublic(BaseModel):
    id: int
    tenant: str
    owner: str
    kind: str
    gpus: int
    state: str
    node: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    idle_s: float | None
    idle_timeout_s: float
    url: str = Field(description="The session's page through the control plane's proxy")
    trial_id: int | None
    message: str | None

    @classmethod
    def of(cls, view: SessionView) -> SessionPublic:
        return cls(**view.__dict__)


class SessionsPublic(BaseModel):
    data: list[SessionPublic]
    count: int


class SessionLimitsPublic(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_gpus: Annotated[int | None, Field(ge=0, le=4096)] = None
    max_length_s: Annotated[float | None, Field(gt=0, le=365 * 86400.0)] = None


def sessions(services: Services) -> SessionService:
    if services.sessions is None:
        raise Conflict("this control plane runs without sessions", "start it with trainhub server")
    return services.sessions


@router.post(
    "/sessions",
    status_code=status.HTTP_201_CREATED,
    response_model=SessionPublic,
    responses=errors(403, 404, 409, 422),
)
def start_session(
    services: ServicesDep, principal: CurrentPrincipal, body: SessionCreate
) -> SessionPublic:
    """Queue a session; it starts like a trial. 422 when it asks for more GPUs than its
    tenant may ever hold."""
    view = sessions(services).start(
        principal,
        SessionRequest(
            kind=body.kind,
            gpus=body.gpus,
            idle_timeout_s=body.idle_timeout_s,
            data=tuple(body.data),
            requirements=body.requirements,
            trials=tuple(body.trials),
            tenant=body.tenant,
            preemptible=body.preemptible,
        ),
    )
    return SessionPublic.of(view)


@router.get("/sessions", response_model=SessionsPublic, responses=errors(403))
def list_sessions(
    services: ServicesDep, principal: CurrentPrincipal, all: bool = False
) -> SessionsPublic:
    """The sessions of one's tenants that have not ended (``all=true``: the ended too)."""
    views = sessions(services).list_sessions(principal, include_ended=all)
    return SessionsPublic(data=[SessionPublic.of(v) for v in views], count=len(views))


@router.get("/sessions/{session_id}", response_model=SessionPublic, responses=errors(404))
def get_session(
    services: ServicesDep, principal: CurrentPrincipal, session_id: SessionId
) -> SessionPublic:
    return SessionPublic.of(sessions(services).get(principal, session_id))


@router.post("/sessions/{session_id}/stop", response_model=SessionPublic, responses=errors(404))
def stop_session(
    services: ServicesDep, principal: CurrentPrincipal, session_id: SessionId
) -> SessionPublic:
    """End the session and free its GPUs (its owner's home folder is kept)."""
    return SessionPublic.of(sessions(services).stop(principal, session_id))


@router.get(
    "/tenants/{tenant}/session-limits", response_model=SessionLimitsPublic, responses=errors(404)
)
def get_session_limits(
    services: ServicesDep, principal: CurrentPrincipal, tenant: TenantName
) -> SessionLimitsPublic:
    found = sessions(services).get_limits(principal, tenant)
    return SessionLimitsPublic(max_gpus=found.max_gpus, max_length_s=found.max_length_s)


@router.put(
    "/tenants/{tenant}/session-limits",
    response_model=SessionLimitsPublic,
    responses=errors(403, 404),
)
def set_session_limits(
    services: ServicesDep,
    principal: CurrentPrincipal,
    tenant: TenantName,
    body: SessionLimitsPublic,
) -> SessionLimitsPublic:
    """GPUs per session and the longest session of a tenant (cluster admins)."""
    sessions(services).set_limits(
        principal, tenant, SessionLimits(body.max_gpus, body.max_length_s)
    )
    return body
