"""What the experiment page shows, built once for the page and for its live updates."""

from __future__ import annotations

from typing import Any

from trainhub.core.best_so_far import TrialValue, best_so_far
from trainhub.service.container import Services
from trainhub.service.ports import Principal
from trainhub.web.parcoords import parcoords_data
from trainhub.web.site import templates


def experiment_context(
    services: Services, principal: Principal, experiment_id: int
) -> dict[str, Any]:
    detail = services.experiments.get(principal, experiment_id)
    metric, mode, best = None, "min", {}
    if services.steering is not None:
        progress = services.steering.progress(principal, experiment_id)
        metric, mode = progress.metric, progress.mode
        best = {r.trial.id: r.metric for r in progress.results}
    hparam_names = sorted({k for t in detail.trials for k in t.hparams})
    return {
        "experiment": detail.experiment,
        "trials": detail.trials,
        "metric": metric,
        "mode": mode,
        "best": best,
        "hparam_names": hparam_names,
        "steerable": services.steering is not None,
        "parcoords": parcoords_data(detail.trials, best, metric, mode),
        "best_so_far": best_so_far(
            (TrialValue(t.id, t.ended_at, best.get(t.id)) for t in detail.trials), mode
        ),
    }


def experiment_update(
    services: Services, principal: Principal, experiment_id: int
) -> dict[str, Any]:
    """The live part of the experiment page: its state, the trials' rows, the plot's data."""
    context = experiment_context(services, principal, experiment_id)
    rows = templates.get_template("_trials.html").render(**context)
    return {
        "state": context["experiment"].state.value,
        "trials_html": rows,
        "parcoords": context["parcoords"],
        "best_so_far": context["best_so_far"],
        "trial_states": {t.id: t.state.value for t in context["trials"]},
    }
