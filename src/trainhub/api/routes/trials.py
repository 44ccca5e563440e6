"""Trials: show, cancel, and what their runtime reports (metrics, checkpoints, logs, signals)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from trainhub.api.bodies import json_body, parse_json_body
from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.params import Attempt, CheckpointId, Offset, Step, TrialId, errors
from trainhub.api.schemas import (
    METRICS_BATCH,
    CheckpointPublic,
    CheckpointsPublic,
    LayerAlertPublic,
    LayerAlertsPublic,
    LogChunkPublic,
    MetricPointPublic,
    MetricsPublic,
    SignalsPublic,
    StartupBody,
    TrialDetailPublic,
    TrialPublic,
)
from trainhub.core import limits
from trainhub.core.errors import InvalidRequest, TooLarge
from trainhub.service.records import Checkpoint

router = APIRouter(prefix="/trials", tags=["trials"])

# chunks of an upload are gathered to this size before one write to storage
_WRITE_BYTES = 1 << 20
_MAX_METRICS_QUERY_CHARS = 16 * 1024


@router.get("/{trial_id}", response_model=TrialDetailPublic, responses=errors(404))
def get_trial(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> TrialDetailPublic:
    detail = services.experiments.get_trial(principal, trial_id)
    return TrialDetailPublic.of_detail(detail, services.tracking.writes(detail.trial))


@router.post("/{trial_id}/cancel", response_model=TrialPublic, responses=errors(404, 409))
def cancel_trial(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> TrialPublic:
    return TrialPublic.of(services.experiments.cancel_trial(principal, trial_id))


@router.post(
    "/{trial_id}/metrics",
    response_model=SignalsPublic,
    responses=errors(404, 409, 411),
    openapi_extra=json_body(METRICS_BATCH),
)
async def report_metrics(
    request: Request, services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> SignalsPublic:
    """Record metrics (the trial's own token; admins too, audited). A step reported again
    replaces its values. Values are finite numbers: NaN, infinities, strings and booleans
    are refused (422). The reply says whether the trial should stop, and why: a prune the
    searcher decides on these values is decided before the reply."""
    batch = parse_json_body(METRICS_BATCH, await request.body())
    progress = batch.get("progress")
    stop, reason = await run_in_threadpool(
        services.tracking.report_metrics,
        principal,
        trial_id,
        batch.get("attempt", 1),
        [(p["step"], p["values"]) for p in batch.get("points", [])],
        progress.model_dump() if progress else None,
    )
    return SignalsPublic(should_stop=stop, reason=reason)


@router.post("/{trial_id}/startup", status_code=204, responses=errors(404, 409))
def report_startup(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId, body: StartupBody
) -> Response:
    """Rank 0's startup marks of one attempt (the trial's own token), sent once after its first
    optimizer step; they become the attempt's startup phases (``trainhub show``)."""
    services.tracking.record_startup(principal, trial_id, body.attempt, body.marks, body.warm)
    return Response(status_code=204)


@router.get("/{trial_id}/metrics", response_model=MetricsPublic, responses=errors(404))
def list_metrics(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    after_step: Annotated[int | None, Query(ge=-1, le=limits.INT64_MAX)] = None,
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


@router.get("/{trial_id}/alerts", response_model=LayerAlertsPublic, responses=errors(404))
def list_layer_alerts(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    limit: Annotated[int, Query(ge=1, le=1000)] = 1000,
) -> LayerAlertsPublic:
    """Layer-health alerts (vanishing or exploding gradients, dead layers, NaN/Inf) raised
    from the trial's ``layers/*`` metrics, earliest first, with the step and the layer."""
    alerts = services.tracking.list_layer_alerts(principal, trial_id, limit)
    data = [LayerAlertPublic.of(a) for a in alerts]
    return LayerAlertsPublic(data=data, count=len(data))


def _parse_metrics(text: str) -> dict[str, Any]:
    try:
        parsed: Any = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        raise InvalidRequest("query parameter 'metrics' must be a JSON object")
    return parsed


@router.post(
    "/{trial_id}/checkpoints",
    status_code=201,
    response_model=CheckpointPublic,
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
async def upload_checkpoint(
    request: Request,
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    uuid: Annotated[str, Query(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")],
    step: Step,
    attempt: Attempt = 1,
    metrics: Annotated[str, Query(max_length=_MAX_METRICS_QUERY_CHARS)] = "{}",
) -> CheckpointPublic:
    """Upload a checkpoint file as the raw request body (the trial's own token; admins too,
    audited). Retrying with the same uuid is safe.

    The Content-Length is checked against the checkpoint size limit and the trial's and
    tenant's storage quotas before the body is read; the body streams to storage in chunks
    and is registered in the database only once it is stored whole.
    """
    declared = request.headers.get("content-length")
    size = int(declared) if declared is not None and declared.isdigit() else None
    upload = await run_in_threadpool(
        services.tracking.begin_checkpoint,
        principal,
        trial_id,
        uuid,
        step,
        attempt,
        _parse_metrics(metrics),
        size,
    )
    if isinstance(upload, Checkpoint):
        return CheckpointPublic.of(upload)  # a retry: nothing to store
    writer = await run_in_threadpool(services.tracking.open_checkpoint_writer, upload)
    try:
        pending: list[bytes] = []
        pending_bytes = 0
        received = 0
        async for chunk in request.stream():
            received += len(chunk)
            if received > upload.max_bytes:
                raise TooLarge(
                    f"the checkpoint is longer than the {upload.max_bytes} bytes its quotas "
                    "leave room for",
                    "save a smaller state or ask an admin to raise the storage quotas",
                )
            pending.append(chunk)
            pending_bytes += len(chunk)
            if pending_bytes >= _WRITE_BYTES:
                await run_in_threadpool(writer.write, b"".join(pending))
                pending, pending_bytes = [], 0
        if pending:
            await run_in_threadpool(writer.write, b"".join(pending))
    except BaseException:
        await run_in_threadpool(writer.abort)
        raise
    checkpoint = await run_in_threadpool(
        services.tracking.finish_checkpoint, principal, upload, writer
    )
    return CheckpointPublic.of(checkpoint)


@router.get("/{trial_id}/checkpoints", response_model=CheckpointsPublic, responses=errors(404))
def list_checkpoints(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> CheckpointsPublic:
    rows = services.tracking.list_checkpoints(principal, trial_id)
    return CheckpointsPublic(data=[CheckpointPublic.of(c) for c in rows], count=len(rows))


@router.get(
    "/{trial_id}/checkpoints/{checkpoint_id}/file",
    response_class=Response,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The file."},
        **errors(404),
    },
)
def download_checkpoint(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    checkpoint_id: CheckpointId,
) -> Response:
    """The checkpoint's bytes, streamed in chunks."""
    checkpoint, chunks = services.tracking.checkpoint_chunks(principal, trial_id, checkpoint_id)
    return StreamingResponse(
        iterate_in_threadpool(chunks),
        media_type="application/octet-stream",
        headers={"Content-Length": str(checkpoint.size_bytes)},
    )


@router.get("/{trial_id}/signals", response_model=SignalsPublic, responses=errors(404))
def get_signals(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> SignalsPublic:
    """Whether the trial should checkpoint and stop (cancel, preemption), and why."""
    stop, reason = services.tracking.signals(principal, trial_id)
    return SignalsPublic(should_stop=stop, reason=reason)


@router.get("/{trial_id}/logs", response_model=LogChunkPublic, responses=errors(404))
def get_logs(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    rank: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    attempt: Annotated[
        int | None, Query(ge=1, le=limits.INT64_MAX, description="Default: the latest.")
    ] = None,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=1024 * 1024)] = 256 * 1024,
) -> LogChunkPublic:
    """Output of one rank of one attempt from a byte offset; poll with next_offset to follow."""
    chunk = services.tracking.read_logs(principal, trial_id, attempt, rank, offset, limit)
    return LogChunkPublic.of(chunk)
