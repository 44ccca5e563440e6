"""Trials: show, cancel, and what their runtime reports (metrics, checkpoints, logs, signals)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.schemas import (
    CheckpointPublic,
    CheckpointsPublic,
    LogChunkPublic,
    MetricPointPublic,
    MetricsBatchIn,
    MetricsPublic,
    SignalsPublic,
    TrialDetailPublic,
    TrialPublic,
)
from trainhub.core.errors import InvalidRequest

router = APIRouter(prefix="/trials", tags=["trials"])


@router.get("/{trial_id}", response_model=TrialDetailPublic)
def get_trial(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: int
) -> TrialDetailPublic:
    return TrialDetailPublic.of_detail(services.experiments.get_trial(principal, trial_id))


@router.post("/{trial_id}/cancel", response_model=TrialPublic)
def cancel_trial(services: ServicesDep, principal: CurrentPrincipal, trial_id: int) -> TrialPublic:
    return TrialPublic.of(services.experiments.cancel_trial(principal, trial_id))


@router.post("/{trial_id}/metrics", status_code=204)
def report_metrics(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: int, batch: MetricsBatchIn
) -> Response:
    """Record metrics (the runtime calls this). A step reported again replaces its values."""
    services.tracking.record_metrics(
        principal,
        trial_id,
        batch.attempt,
        [(p.step, p.values) for p in batch.points],
        batch.progress.model_dump() if batch.progress else None,
    )
    return Response(status_code=204)


@router.get("/{trial_id}/metrics", response_model=MetricsPublic)
def list_metrics(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: int,
    after_step: int | None = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> MetricsPublic:
    points = services.tracking.list_metrics(principal, trial_id, after_step, limit)
    data = [
        MetricPointPublic(
            step=p.step, attempt=p.attempt, values=p.values, reported_at=p.reported_at
        )
        for p in points
    ]
    return MetricsPublic(data=data, count=len(data))


@router.post("/{trial_id}/checkpoints", status_code=201, response_model=CheckpointPublic)
async def upload_checkpoint(
    request: Request,
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: int,
    uuid: str,
    step: Annotated[int, Query(ge=0)],
    attempt: Annotated[int, Query(ge=1)] = 1,
    metrics: str = "{}",
) -> CheckpointPublic:
    """Upload a checkpoint file as the raw request body. Retrying with the same uuid is safe."""
    try:
        parsed: Any = json.loads(metrics)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise InvalidRequest("query parameter 'metrics' must be a JSON object")
    data = await request.body()
    checkpoint = await run_in_threadpool(
        services.tracking.register_checkpoint,
        principal,
        trial_id,
        uuid,
        step,
        attempt,
        parsed,
        data,
    )
    return CheckpointPublic.of(checkpoint)


@router.get("/{trial_id}/checkpoints", response_model=CheckpointsPublic)
def list_checkpoints(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: int
) -> CheckpointsPublic:
    rows = services.tracking.list_checkpoints(principal, trial_id)
    return CheckpointsPublic(data=[CheckpointPublic.of(c) for c in rows], count=len(rows))


@router.get(
    "/{trial_id}/checkpoints/{checkpoint_id}/file",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
def download_checkpoint(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: int, checkpoint_id: int
) -> Response:
    data = services.tracking.checkpoint_data(principal, trial_id, checkpoint_id)
    return Response(content=data, media_type="application/octet-stream")


@router.get("/{trial_id}/signals", response_model=SignalsPublic)
def get_signals(services: ServicesDep, principal: CurrentPrincipal, trial_id: int) -> SignalsPublic:
    """Whether the trial should checkpoint and stop (cancel, preemption), and why."""
    stop, reason = services.tracking.signals(principal, trial_id)
    return SignalsPublic(should_stop=stop, reason=reason)


@router.get("/{trial_id}/logs", response_model=LogChunkPublic)
def get_logs(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: int,
    rank: Annotated[int, Query(ge=0)] = 0,
    attempt: Annotated[int | None, Query(ge=1, description="Default: the latest.")] = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1024 * 1024)] = 256 * 1024,
) -> LogChunkPublic:
    """Output of one rank of one attempt from a byte offset; poll with next_offset to follow."""
    chunk = services.tracking.read_logs(principal, trial_id, attempt, rank, offset, limit)
    return LogChunkPublic.of(chunk)
