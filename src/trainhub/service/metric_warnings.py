"""The searcher-metric warnings of a trial and an experiment, as the API, CLI and dashboard
show them (rules: :mod:`trainhub.core.searcher_metric`; read from the stored spec and the
trials' latest metrics, so nothing new is stored)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainhub.core.searcher_metric import experiment_warning, trial_warning
from trainhub.service.records import Trial


def _searcher(spec: Mapping[str, Any]) -> tuple[str | None, int]:
    searcher = spec.get("searcher") or {}
    if not isinstance(searcher, Mapping):
        return None, 1
    metric = searcher.get("metric")
    budget = searcher.get("budget") or {}
    first_rung = budget.get("min", 1) if isinstance(budget, Mapping) else 1
    return (
        metric if isinstance(metric, str) else None,
        first_rung if isinstance(first_rung, int) else 1,
    )


def trial_metric_warning(spec: Mapping[str, Any], trial: Trial) -> str | None:
    """The trial's warning that it does not report the searcher's metric, or None."""
    metric, first_rung = _searcher(spec)
    step = trial.latest_metrics.get("step")
    found = trial_warning(
        metric,
        trial.latest_metrics,
        latest_step=step if isinstance(step, int) else None,
        first_rung=first_rung,
        ended=trial.state.is_terminal,
    )
    return found.message if found is not None else None


def experiment_metric_warnings(spec: Mapping[str, Any], trials: Sequence[Trial]) -> list[str]:
    """The experiment's warnings: no trial reports the searcher's metric (once some trial is
    past its first reports)."""
    if not any(trial_metric_warning(spec, t) for t in trials):
        return []
    metric, _ = _searcher(spec)
    said = experiment_warning(metric, [t.latest_metrics.keys() for t in trials])
    return [said] if said else []
