"""Searches and steering: progress, pause, resume, kill, limits, clone (CLI and dashboard)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, UploadFile
from starlette.concurrency import run_in_threadpool

from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.params import ExperimentId, TrialId, errors
from trainhub.api.schemas import ExperimentDetailPublic, TrialPublic
from trainhub.api.search_schemas import (
    CloneIn,
    ImportancePublic,
    SearchLimitsIn,
    SearchProgressPublic,
    TemplateFromExperimentIn,
    TemplatePublic,
    TemplatesPublic,
    TemplateSubmitIn,
    TrialCloneIn,
)
from trainhub.core.errors import Conflict
from trainhub.service.container import Services
from trainhub.service.steering import SampleFilter, SteeringService

# every search route names an experiment, trial or template (404), may find it in a state that
# refuses the change or a control plane without search (409), and bounds its body (411)
router = APIRouter(tags=["search"], responses=errors(404, 409, 411))


def _steering(services: Services) -> SteeringService:
    if services.steering is None:
        raise Conflict("this control plane runs without search", "start it with trainhub server")
    return services.steering


@router.get("/experiments/{experiment_id}/search", response_model=SearchProgressPublic)
def get_search(
    services: ServicesDep, principal: CurrentPrincipal, experiment_id: ExperimentId
) -> SearchProgressPublic:
    """Progress of an experiment's search: trials by state, best first, the best so far."""
    return SearchProgressPublic.of(_steering(services).progress(principal, experiment_id))


@router.patch("/experiments/{experiment_id}/search", response_model=SearchProgressPublic)
def set_search_limits(
    services: ServicesDep,
    principal: CurrentPrincipal,
    experiment_id: ExperimentId,
    body: SearchLimitsIn,
) -> SearchProgressPublic:
    """Raise or lower max_trials / max_concurrent_trials of a running search."""
    progress = _steering(services).set_limits(
        principal, experiment_id, body.max_trials, body.max_concurrent_trials
    )
    return SearchProgressPublic.of(progress)


@router.get("/experiments/{experiment_id}/importance", response_model=ImportancePublic)
def get_importance(
    services: ServicesDep, principal: CurrentPrincipal, experiment_id: ExperimentId
) -> ImportancePublic:
    return ImportancePublic(importance=_steering(services).importance(principal, experiment_id))


@router.post("/experiments/{experiment_id}/pause", response_model=SearchProgressPublic)
def pause_experiment(
    services: ServicesDep, principal: CurrentPrincipal, experiment_id: ExperimentId
) -> SearchProgressPublic:
    """Checkpoint and park every trial (freeing its slots); a search makes no new trials."""
    return SearchProgressPublic.of(_steering(services).pause_experiment(principal, experiment_id))


@router.post("/experiments/{experiment_id}/resume", response_model=SearchProgressPublic)
def resume_experiment(
    services: ServicesDep, principal: CurrentPrincipal, experiment_id: ExperimentId
) -> SearchProgressPublic:
    return SearchProgressPublic.of(_steering(services).resume_experiment(principal, experiment_id))


@router.post("/experiments/{experiment_id}/kill", response_model=ExperimentDetailPublic)
def kill_experiment(
    services: ServicesDep, principal: CurrentPrincipal, experiment_id: ExperimentId
) -> ExperimentDetailPublic:
    """Stop every trial and the search for good."""
    detail = _steering(services).kill_experiment(principal, experiment_id)
    return ExperimentDetailPublic.of_detail(detail)


@router.post(
    "/experiments/{experiment_id}/clone", status_code=201, response_model=ExperimentDetailPublic
)
def clone_experiment(
    services: ServicesDep, principal: CurrentPrincipal, experiment_id: ExperimentId, body: CloneIn
) -> ExperimentDetailPublic:
    """Submit a copy with changes, optionally warm-started from a trial's latest checkpoint."""
    detail = _steering(services).clone_experiment(
        principal, experiment_id, body.set, body.from_checkpoint_trial
    )
    return ExperimentDetailPublic.of_detail(detail)


@router.post("/trials/{trial_id}/pause", response_model=TrialPublic)
def pause_trial(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> TrialPublic:
    """Checkpoint and stop; the trial waits PAUSED (its slots freed) until resumed."""
    return TrialPublic.of(_steering(services).pause_trial(principal, trial_id))


@router.post("/trials/{trial_id}/resume", response_model=TrialPublic)
def resume_trial(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> TrialPublic:
    """Queue a paused trial again; it resumes from its latest checkpoint."""
    return TrialPublic.of(_steering(services).resume_trial(principal, trial_id))


@router.post("/trials/{trial_id}/kill", response_model=TrialPublic)
def kill_trial(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> TrialPublic:
    return TrialPublic.of(_steering(services).kill_trial(principal, trial_id))


@router.post("/trials/{trial_id}/clone", status_code=201, response_model=ExperimentDetailPublic)
def clone_trial(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId, body: TrialCloneIn
) -> ExperimentDetailPublic:
    """A new single-trial experiment with this trial's hyperparameters, changed as asked;
    optionally without its most suspicious samples or with some relabeled."""
    drop: list[int] = []
    if body.drop_flagged is not None:
        if services.debugging is None:
            raise Conflict("this control plane does not keep sample records")
        drop = services.debugging.flagged_ids(principal, trial_id, body.drop_flagged)
    sample_filter = SampleFilter.of(drop, body.relabel or {})
    if sample_filter.relabel and services.debugging is not None:
        services.debugging.check_relabel(principal, trial_id, dict(sample_filter.relabel))
    detail = _steering(services).clone_trial(
        principal, trial_id, body.set, body.from_checkpoint, sample_filter=sample_filter
    )
    return ExperimentDetailPublic.of_detail(detail)


@router.get("/templates", response_model=TemplatesPublic)
def list_templates(services: ServicesDep, principal: CurrentPrincipal) -> TemplatesPublic:
    rows = _steering(services).list_templates(principal)
    return TemplatesPublic(data=[TemplatePublic.of(t) for t in rows], count=len(rows))


@router.post("/templates", status_code=201, response_model=TemplatePublic)
async def save_template(
    services: ServicesDep,
    principal: CurrentPrincipal,
    name: Annotated[str, Form(description="Template name, unique in the tenant.")],
    spec: Annotated[str, Form(description="The experiment spec, YAML text.")],
    context: Annotated[UploadFile | None, File(description="The code as tar.gz.")] = None,
    tenant: Annotated[str | None, Form()] = None,
) -> TemplatePublic:
    """Save a spec (and its code) as a named template of the tenant; replaces one of that name."""
    data = await context.read() if context is not None else None
    template = await run_in_threadpool(
        _steering(services).save_template,
        principal,
        name,
        spec_yaml=spec,
        context=data,
        tenant=tenant,
    )
    return TemplatePublic.of(template)


@router.post(
    "/experiments/{experiment_id}/template", status_code=201, response_model=TemplatePublic
)
def save_experiment_as_template(
    services: ServicesDep,
    principal: CurrentPrincipal,
    experiment_id: ExperimentId,
    body: TemplateFromExperimentIn,
) -> TemplatePublic:
    """Save an experiment's spec and code as a template of its tenant."""
    template = _steering(services).save_template(principal, body.name, experiment_id=experiment_id)
    return TemplatePublic.of(template)


@router.post("/templates/{name}/submit", status_code=201, response_model=ExperimentDetailPublic)
def submit_template(
    services: ServicesDep, principal: CurrentPrincipal, name: str, body: TemplateSubmitIn
) -> ExperimentDetailPublic:
    """Submit a template with changes (``{"set": {"lr": 0.01}}``)."""
    detail = _steering(services).submit_template(principal, name, body.tenant, body.set)
    return ExperimentDetailPublic.of_detail(detail)
