"""The queue, priorities and usage accounting."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response

from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.params import TrialId, errors
from trainhub.api.schemas import (
    QueuePublic,
    TenantSharePublic,
    TenantStoragePublic,
    TrialPublic,
    TrialUpdate,
    UsagePublic,
    UsageRowPublic,
)
from trainhub.service.usage import usage_csv

router = APIRouter(tags=["scheduling"])
_MAX_TIME = 1e11  # unix seconds, year 5138


@router.get("/queue", response_model=QueuePublic, responses=errors())
def get_queue(services: ServicesDep, principal: CurrentPrincipal) -> QueuePublic:
    """Queued trials in scheduling order, each with its position and pending reason; ``note``
    says when tenant guarantees exceed the cluster and are scaled down."""
    trials = services.experiments.queue(principal)
    note = services.experiments.guarantee_note(principal)
    return QueuePublic(data=[TrialPublic.of(t) for t in trials], count=len(trials), note=note)


@router.patch("/trials/{trial_id}", response_model=TrialPublic, responses=errors(404, 409, 411))
def update_trial(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId, body: TrialUpdate
) -> TrialPublic:
    return TrialPublic.of(services.experiments.set_priority(principal, trial_id, body.priority))


@router.get(
    "/usage",
    response_model=UsagePublic,
    responses={200: {"content": {"text/csv": {}}}, **errors()},
)
def get_usage(
    services: ServicesDep,
    principal: CurrentPrincipal,
    since: Annotated[
        float | None,
        Query(
            ge=0, le=_MAX_TIME, allow_inf_nan=False, description="Unix seconds; default 7 days ago"
        ),
    ] = None,
    until: Annotated[
        float | None,
        Query(ge=0, le=_MAX_TIME, allow_inf_nan=False, description="Unix seconds; default now"),
    ] = None,
    format: Literal["json", "csv"] = "json",
) -> UsagePublic | Response:
    """Allocated slot-hours and network bytes (inter-node sent and received, intra-node) per
    day, tenant, user and project; each tenant's share vs its guarantee over the period."""
    report = services.usage.report(principal, since, until)
    if format == "csv":
        return Response(usage_csv(report.rows), media_type="text/csv")
    return UsagePublic(
        since=report.since,
        until=report.until,
        data=[UsageRowPublic(**vars(r)) for r in report.rows],
        tenants=[TenantSharePublic(**vars(t)) for t in report.tenants],
        storage=[TenantStoragePublic(**vars(s)) for s in report.storage],
    )
