"""Request and response bodies of the search and steering routes."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from trainhub.api.schemas import ExperimentPublic, TrialPublic
from trainhub.core.limits import INT64_MAX, MAX_FILTERED_SAMPLES
from trainhub.core.states import TrialState
from trainhub.service.metric_warnings import experiment_metric_warnings
from trainhub.service.search_ports import SearchState, SpecTemplate
from trainhub.service.steering import SearchProgress, TrialResult


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CloneIn(_In):
    set: dict[str, Any] = Field(
        default_factory=dict,
        description="Changes by dotted path: {'lr': 0.01, 'searcher.max_trials': 64}; a path "
        "that is not a spec field names a hyperparameter.",
    )
    from_checkpoint_trial: int | None = Field(
        None,
        ge=1,
        le=INT64_MAX,
        description="Warm-start every trial from this trial's latest checkpoint.",
    )


class TrialCloneIn(_In):
    set: dict[str, Any] = Field(default_factory=dict)
    from_checkpoint: bool = Field(True, description="Start from this trial's latest checkpoint.")
    drop_flagged: float | None = Field(
        None,
        gt=0,
        le=0.5,
        description="Train without this fraction of the trial's samples, the most likely "
        "mislabeled first (its sample records: docs/debugging.md).",
    )
    relabel: dict[str, int] | None = Field(
        None,
        max_length=MAX_FILTERED_SAMPLES,
        description="Train with these labels: {sample id: label}.",
    )


class SearchLimitsIn(_In):
    max_trials: Annotated[int | None, Field(ge=1, le=100_000)] = None
    max_concurrent_trials: Annotated[int | None, Field(ge=1, le=10_000)] = None


class TrialResultPublic(BaseModel):
    id: int
    state: TrialState
    hparams: dict[str, Any]
    metric: float | None = Field(description="Best value of the searcher's metric.")
    epochs: int | None = Field(
        description="How far it got: its progress (ctx.set_progress), else its latest step."
    )
    stop_detail: str | None = Field(description="Why it was pruned or paused.")
    parent_trial_id: int | None
    trial: TrialPublic

    @classmethod
    def of(cls, r: TrialResult, spec: dict[str, Any] | None = None) -> TrialResultPublic:
        return cls(
            id=r.trial.id,
            state=r.trial.state,
            hparams=r.trial.hparams,
            metric=r.metric,
            epochs=r.steps,
            stop_detail=r.stop_detail,
            parent_trial_id=r.parent_trial_id,
            trial=TrialPublic.of(r.trial, spec),
        )


class SearchProgressPublic(BaseModel):
    experiment: ExperimentPublic
    searcher: str = Field(description="single, search or pbt.")
    search_state: SearchState | None
    max_trials: int | None
    max_concurrent_trials: int | None
    metric: str | None
    mode: str
    counts: dict[str, int] = Field(description="Trials by state.")
    best: TrialResultPublic | None
    data: list[TrialResultPublic] = Field(description="Trials, best first.")
    count: int
    warnings: list[str] = Field(
        default=[], description="What may be wrong, e.g. a searcher metric no trial reports."
    )

    @classmethod
    def of(cls, p: SearchProgress) -> SearchProgressPublic:
        spec = p.experiment.spec
        trials = [r.trial for r in p.results]
        return cls(
            experiment=ExperimentPublic.of(p.experiment),
            searcher=str(p.experiment.spec.get("searcher", {}).get("name") or "")
            or ("single" if p.search is None else "search"),
            search_state=p.search.state if p.search else None,
            max_trials=p.search.max_trials if p.search else None,
            max_concurrent_trials=p.search.max_concurrent_trials if p.search else None,
            metric=p.metric,
            mode=p.mode,
            counts=p.counts,
            best=TrialResultPublic.of(p.best) if p.best else None,
            data=[TrialResultPublic.of(r, spec) for r in p.results],
            count=len(p.results),
            warnings=experiment_metric_warnings(spec, trials),
        )


class ImportancePublic(BaseModel):
    importance: dict[str, float] = Field(
        description="Optuna's hyperparameter importance (sums to 1; empty with < 2 completed)."
    )


class TemplateFromExperimentIn(_In):
    name: str = Field(description="Template name, unique in the tenant.")


class TemplateSubmitIn(_In):
    set: dict[str, Any] = Field(default_factory=dict, description="Changes, as for clone.")
    tenant: str | None = None


class TemplatePublic(BaseModel):
    tenant: str
    name: str
    spec_yaml: str
    has_context: bool
    created_by: str
    created_at: float

    @classmethod
    def of(cls, t: SpecTemplate) -> TemplatePublic:
        return cls(
            tenant=t.tenant,
            name=t.name,
            spec_yaml=t.spec_yaml,
            has_context=t.context_key is not None,
            created_by=t.created_by,
            created_at=t.created_at,
        )


class TemplatesPublic(BaseModel):
    data: list[TemplatePublic]
    count: int
