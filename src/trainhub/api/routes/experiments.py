"""Experiments: submit (spec + code context), list, show, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Query, UploadFile
from starlette.concurrency import run_in_threadpool

from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.schemas import ExperimentDetailPublic, ExperimentPublic, ExperimentsPublic
from trainhub.core.states import ExperimentState

router = APIRouter(prefix="/experiments", tags=["experiments"])


@router.post("", status_code=201, response_model=ExperimentDetailPublic)
async def submit_experiment(
    services: ServicesDep,
    principal: CurrentPrincipal,
    spec: Annotated[str, Form(description="The experiment spec, YAML text.")],
    context: Annotated[
        UploadFile | None, File(description="The code directory as a tar.gz archive.")
    ] = None,
    tenant: Annotated[str | None, Form(description="Tenant to submit to.")] = None,
) -> ExperimentDetailPublic:
    """Submit an experiment. Returns at once; the scheduler starts its trial."""
    data = await context.read() if context is not None else None
    detail = await run_in_threadpool(services.experiments.submit, principal, spec, data, tenant)
    return ExperimentDetailPublic.of_detail(detail)


@router.get("", response_model=ExperimentsPublic)
def list_experiments(
    services: ServicesDep,
    principal: CurrentPrincipal,
    state: ExperimentState | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> ExperimentsPublic:
    rows, count = services.experiments.list_experiments(principal, state, limit, offset)
    return ExperimentsPublic(data=[ExperimentPublic.of(e) for e in rows], count=count)


@router.get("/{experiment_id}", response_model=ExperimentDetailPublic)
def get_experiment(
    services: ServicesDep, principal: CurrentPrincipal, experiment_id: int
) -> ExperimentDetailPublic:
    return ExperimentDetailPublic.of_detail(services.experiments.get(principal, experiment_id))


@router.post("/{experiment_id}/cancel", response_model=ExperimentDetailPublic)
def cancel_experiment(
    services: ServicesDep, principal: CurrentPrincipal, experiment_id: int
) -> ExperimentDetailPublic:
    """Cancel every trial that has not ended; running ones stop within a scheduler tick."""
    detail = services.experiments.cancel_experiment(principal, experiment_id)
    return ExperimentDetailPublic.of_detail(detail)
