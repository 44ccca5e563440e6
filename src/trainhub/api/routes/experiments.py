"""Experiments: submit (spec + code context), list, show, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.params import (
    ExperimentId,
    ExperimentSort,
    ListFilter,
    Offset,
    SortOrder,
    errors,
)
from trainhub.api.schemas import ExperimentDetailPublic, ExperimentPublic, ExperimentsPublic
from trainhub.core import limits
from trainhub.core.errors import FieldError, InvalidSpec
from trainhub.core.states import ExperimentState

router = APIRouter(prefix="/experiments", tags=["experiments"])

_SUBMIT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "spec": {
                            "type": "string",
                            "maxLength": limits.MAX_SPEC_BYTES,
                            "description": "The experiment spec, YAML text "
                            f"(at most {limits.MAX_SPEC_BYTES} bytes).",
                        },
                        "context": {
                            "type": "string",
                            "format": "binary",
                            "description": "The code directory as a tar.gz archive.",
                        },
                        "tenant": {
                            "type": "string",
                            "maxLength": 64,
                            "description": "Tenant to submit to.",
                        },
                    },
                }
            }
        },
    }
}


@router.post(
    "",
    status_code=201,
    response_model=ExperimentDetailPublic,
    responses=errors(404, 411),
    openapi_extra=_SUBMIT_BODY,
)
async def submit_experiment(
    request: Request, services: ServicesDep, principal: CurrentPrincipal
) -> ExperimentDetailPublic:
    """Submit an experiment. Returns at once; the scheduler starts its trial.

    The archive is spooled to disk while the form is read and copied into storage in chunks.
    """
    async with request.form(
        max_files=1, max_fields=3, max_part_size=limits.MAX_SPEC_BYTES + 1
    ) as form:
        spec = form.get("spec")
        context = form.get("context")
        tenant = form.get("tenant")
        problems = []
        if not isinstance(spec, str):
            problems.append(FieldError("spec", "the spec (YAML text) is required as a form field"))
        if context is not None and not isinstance(context, UploadFile):
            problems.append(FieldError("context", "must be a file (a tar.gz archive)"))
        if tenant is not None and not isinstance(tenant, str):
            problems.append(FieldError("tenant", "must be a tenant name"))
        if problems:
            raise InvalidSpec(problems)
        assert isinstance(spec, str)
        file = context.file if isinstance(context, UploadFile) else None
        detail = await run_in_threadpool(
            services.experiments.submit,
            principal,
            spec,
            file,
            tenant if isinstance(tenant, str) and tenant else None,
        )
    return ExperimentDetailPublic.of_detail(detail)


@router.get("", response_model=ExperimentsPublic, responses=errors())
def list_experiments(
    services: ServicesDep,
    principal: CurrentPrincipal,
    state: ExperimentState | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Offset = 0,
    tenant: ListFilter = "",
    project: ListFilter = "",
    user: Annotated[str, Query(max_length=64, description="The submitter's username.")] = "",
    name: Annotated[str, Query(max_length=64, description="Part of the name.")] = "",
    sort: Annotated[
        ExperimentSort,
        Query(description="best: by the best value of the searcher's metric (its mode)."),
    ] = "created",
    order: Annotated[
        SortOrder, Query(description="desc: newest, last name or best first.")
    ] = "desc",
) -> ExperimentsPublic:
    """Experiments of the caller's tenants; a tenant it cannot see lists none. Without a best
    value an experiment sorts last in both orders."""
    rows, count = services.experiments.list_experiments(
        principal,
        state,
        limit,
        offset,
        project=project or None,
        name_contains=name or None,
        tenant=tenant or None,
        owner=user or None,
        sort=sort,
        order=order,
    )
    return ExperimentsPublic(data=[ExperimentPublic.of(e) for e in rows], count=count)


@router.get("/{experiment_id}", response_model=ExperimentDetailPublic, responses=errors(404))
def get_experiment(
    services: ServicesDep, principal: CurrentPrincipal, experiment_id: ExperimentId
) -> ExperimentDetailPublic:
    return ExperimentDetailPublic.of_detail(services.experiments.get(principal, experiment_id))


@router.post(
    "/{experiment_id}/cancel", response_model=ExperimentDetailPublic, responses=errors(404, 409)
)
def cancel_experiment(
    services: ServicesDep, principal: CurrentPrincipal, experiment_id: ExperimentId
) -> ExperimentDetailPublic:
    """Cancel every trial that has not ended; running ones stop within a scheduler tick."""
    detail = services.experiments.cancel_experiment(principal, experiment_id)
    return ExperimentDetailPublic.of_detail(detail)
