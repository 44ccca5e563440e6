"""What the experiment page shows, built once for the page and for its live updates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainhub.core.best_so_far import TrialValue, best_so_far
from trainhub.core.search_space import is_distribution
from trainhub.core.states import experiment_actions
from trainhub.service.container import Services
from trainhub.service.metric_warnings import experiment_metric_warnings
from trainhub.service.ports import Principal
from trainhub.service.records import Trial
from trainhub.web.charts import ChartCache
from trainhub.web.parcoords import parcoords_data
from trainhub.web.site import templates


def _fixed_hparams(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's hyperparameters that no trial varies (not a distribution, not mutated by
    PBT): one line above the table instead of a column each. Read from the spec, so the
    columns stay the same as trials arrive (the live rows reuse the first render's header)."""
    raw = spec.get("hyperparameters")
    searcher = spec.get("searcher")
    mutations = searcher.get("mutations") if isinstance(searcher, Mapping) else None
    mutated = set(mutations) if isinstance(mutations, Mapping) else set()
    if not isinstance(raw, Mapping):
        return {}
    return {
        name: value
        for name, value in sorted(raw.items())
        if name not in mutated and not is_distribution(value)
    }


def experiment_context(
    services: Services, principal: Principal, experiment_id: int
) -> dict[str, Any]:
    detail = services.experiments.get(principal, experiment_id)
    metric, mode, best = None, "min", {}
    if services.steering is not None:
        progress = services.steering.progress(principal, experiment_id)
        metric, mode = progress.metric, progress.mode
        best = {r.trial.id: r.metric for r in progress.results}
    fixed = _fixed_hparams(detail.experiment.spec)
    hparam_names = sorted({k for t in detail.trials for k in t.hparams} - set(fixed))
    return {
        "experiment": detail.experiment,
        "trials": detail.trials,
        "metric": metric,
        "mode": mode,
        "best": best,
        "hparam_names": hparam_names,
        "fixed_hparams": fixed,
        "steerable": services.steering is not None,
        "metric_warnings": experiment_metric_warnings(detail.experiment.spec, detail.trials),
        "actions": experiment_actions(detail.experiment.state),
        "parcoords": parcoords_data(detail.trials, best, metric, mode),
        "best_so_far": best_so_far(
            (TrialValue(t.id, t.ended_at, best.get(t.id)) for t in detail.trials), mode
        ),
    }


def learning_curves(
    charts: ChartCache, principal: Principal, trials: Sequence[Trial], metric: str
) -> dict[str, Any]:
    """``metric`` (or each trial's first metric) of the first 50 trials, 500 buckets each: the
    page draws them on first paint, its script refreshes them from ``curves.json``."""
    curves = {}
    for trial in trials[:50]:
        chart = charts.chart(principal, trial.id, trial.num_attempts, buckets=500)
        names = list(chart["metrics"])
        name = metric if metric in chart["metrics"] else (names[0] if names else None)
        if name is not None:
            curves[f"trial {trial.id}"] = chart["metrics"][name]
    return curves


def experiment_update(
    services: Services, principal: Principal, experiment_id: int
) -> dict[str, Any]:
    """The live part of the experiment page: its state, the trials' rows, the plot's data."""
    context = experiment_context(services, principal, experiment_id)
    rows = templates.get_template("_trials.html").render(**context)
    return {
        "state": context["experiment"].state.value,
        "actions": list(context["actions"]),
        "trials_html": rows,
        "parcoords": context["parcoords"],
        "best_so_far": context["best_so_far"],
        "trial_states": {t.id: t.state.value for t in context["trials"]},
    }
