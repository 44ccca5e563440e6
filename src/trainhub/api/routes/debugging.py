"""Debugging a trial's data: the runtime's sample records in; mislabeled, hard and easy samples,
the confusion matrix, a CSV of every sample's scores and an image grid out (docs/debugging.md)."""

from __future__ import annotations

import csv
import io
from typing import Annotated, Literal, get_args

from fastapi import APIRouter, Query, Response

from trainhub.api.debug_schemas import CSV_COLUMNS, DebugPublic, SampleRecordsIn, sample_of
from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.params import TrialId, errors
from trainhub.core import limits
from trainhub.core.errors import Conflict
from trainhub.core.label_noise import SCORES
from trainhub.service.container import Services
from trainhub.service.debugging import DebugService

router = APIRouter(prefix="/trials", tags=["debugging"], responses=errors(404, 409))

ScoreName = Literal["aum", "confidence", "forgetting", "combined"]
assert get_args(ScoreName) == SCORES, "the route offers every score core computes"
Score = Annotated[ScoreName, Query(description="The mislabel score.")]


def _debugging(services: Services) -> DebugService:
    if services.debugging is None:
        raise Conflict("this control plane does not keep sample records")
    return services.debugging


@router.post("/{trial_id}/samples", status_code=204, responses=errors(411, 413))
def report_samples(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId, batch: SampleRecordsIn
) -> Response:
    """Store training dynamics of samples (the trial's own token; admins too, audited). A
    retry with the same uuid stores nothing twice."""
    _debugging(services).record_samples(principal, trial_id, batch.model_dump())
    return Response(status_code=204)


@router.get("/{trial_id}/debug", response_model=DebugPublic)
def debug_trial(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    top: Annotated[int, Query(ge=0, le=limits.MAX_DEBUG_TOP)] = 20,
    score: Score = "aum",
) -> DebugPublic:
    """Likely mislabeled samples (most suspicious first), regions, per-class accuracy, the
    confusion matrix and the most confused class pairs."""
    report = _debugging(services).report(principal, trial_id, method=score)
    return DebugPublic.of(report, top)


@router.get(
    "/{trial_id}/debug/samples.csv",
    response_class=Response,
    responses={200: {"content": {"text/csv": {}}}},
)
def debug_csv(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId, score: Score = "aum"
) -> Response:
    """Every tracked sample's scores, most suspicious first."""
    report = _debugging(services).report(principal, trial_id, method=score)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for rank, i in enumerate(report.scores.ranking(), start=1):
        writer.writerow([rank, *sample_of(report, int(i)).model_dump().values()])
    return Response(
        out.getvalue(),
        media_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="trial-{trial_id}-samples.csv"'},
    )


@router.get(
    "/{trial_id}/debug/grid.png",
    response_class=Response,
    responses={200: {"content": {"image/png": {}}}},
)
def debug_grid(
    services: ServicesDep,
    principal: CurrentPrincipal,
    trial_id: TrialId,
    top: Annotated[int, Query(ge=1, le=limits.MAX_DEBUG_PNG_SAMPLES)] = 25,
) -> Response:
    """The most suspicious samples' images with given and suggested labels (image datasets
    the control plane can read: ``digits``, ``mnist/...``)."""
    png = _debugging(services).grid_png(principal, trial_id, top)
    return Response(png, media_type="image/png")
