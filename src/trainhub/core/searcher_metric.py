"""Is the searcher's metric reported? The warning when it is not, and when a trial fails for it.

A search whose ``searcher.metric`` no trial reports (``val_acc`` in the spec while the script
reports ``val_accuracy``) gives its sampler and pruner no signal: nothing is pruned, the best
trial is a guess. These rules turn that into a warning on the trial and the experiment, with a
did-you-mean against the names actually reported, and (``searcher.require_metric``) into the
trial's failure once it is certain:

- a trial that reported other metrics but not the searcher's by the first step at which the
  pruner needs the value (``searcher.budget.min``), or that ended without it, gets a warning;
- the warning is certain (the trial fails when the metric is required) when a reported name
  is a close variant of the metric (a typo), or when the trial ended without ever reporting
  it.

A name reported only later in an epoch (``train_loss`` every step, ``val_loss`` at its end) is
not mistaken for a typo: only close variants (similarity >= 0.7, or the same name up to case
and separators) count, and only from the first rung on.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from trainhub.core.searcher_spec import SearcherSpec

# a reported name at least this close to the metric is a typo of it (val_acc / val_accuracy
# is 0.74; loss / val_loss, which are different metrics, is 0.67)
TYPO_SIMILARITY = 0.7
# the names did-you-mean considers (difflib's own cut-off for "close")
SUGGEST_SIMILARITY = 0.6
_SEPARATORS = re.compile(r"[-_./\s]")


@dataclass(frozen=True, slots=True)
class MetricWarning:
    """A searcher metric that is not reported, in words for people.

    ``certain``: a typo of it was reported, or the trial ended without it; a trial that
    requires the metric fails with ``message``."""

    message: str
    suggestion: str | None
    certain: bool


def _reported(names: Iterable[str]) -> list[str]:
    return sorted({n for n in names if n != "step"})


def suggestion(metric: str, reported: Collection[str]) -> str | None:
    """The reported name closest to ``metric`` if it is close enough to be meant, else None."""
    names = _reported(reported)
    folded = _SEPARATORS.sub("", metric.lower())
    for name in names:
        if _SEPARATORS.sub("", name.lower()) == folded:
            return name
    close = difflib.get_close_matches(metric, names, n=1, cutoff=SUGGEST_SIMILARITY)
    return close[0] if close else None


def _is_typo(metric: str, name: str) -> bool:
    if _SEPARATORS.sub("", name.lower()) == _SEPARATORS.sub("", metric.lower()):
        return True
    return difflib.SequenceMatcher(None, metric, name).ratio() >= TYPO_SIMILARITY


def _listed(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def trial_warning(
    metric: str | None,
    reported: Collection[str],
    *,
    latest_step: int | None,
    first_rung: int = 1,
    ended: bool = False,
) -> MetricWarning | None:
    """The warning of one trial that reported ``reported`` (metric names; ``step`` is ignored)
    up to ``latest_step``, or None (no searcher metric, nothing reported yet, or reported).

    Args:
        metric: The spec's ``searcher.metric``.
        reported: Every name the trial has reported.
        latest_step: The highest step it reported.
        first_rung: ``searcher.budget.min``: from this step on the searcher needs the value.
        ended: The trial's processes ended (no more reports will come).
    """
    names = _reported(reported)
    if not metric or metric in reported or not names:
        return None
    past_rung = latest_step is not None and latest_step >= first_rung
    if not (past_rung or ended):
        return None  # its first reports: the metric may come at the end of the epoch
    meant = suggestion(metric, names)
    said = (
        f"searcher metric '{metric}' is not reported (this trial reports {_listed(names)})"
        + (f"; did you mean '{meant}'?" if meant else "")
        + " Fix searcher.metric in the spec or the name given to ctx.report."
    )
    typo = meant is not None and _is_typo(metric, meant)
    return MetricWarning(said, meant, certain=ended or typo)


def failure_at_end(searcher: SearcherSpec, latest_metrics: Mapping[str, object]) -> str | None:
    """Why a trial whose processes all exited 0 fails instead of completing: it requires the
    searcher metric (``searcher.require_metric``) and never reported it; else None."""
    if not searcher.requires_metric or searcher.metric in latest_metrics:
        return None
    warning = trial_warning(searcher.metric, latest_metrics, latest_step=None, ended=True)
    if warning is not None:
        return warning.message
    return (
        f"searcher metric '{searcher.metric}' is not reported: the trial reported no metrics "
        f"at all. Call ctx.report(step=..., {searcher.metric}=...) in the script."
    )


def experiment_warning(
    metric: str | None, reported_by_trial: Iterable[Collection[str]]
) -> str | None:
    """The experiment's warning: no trial reported the searcher metric although some trial
    reported other metrics (did-you-mean against every name reported), else None."""
    if not metric:
        return None
    names: set[str] = set()
    for reported in reported_by_trial:
        if metric in reported:
            return None
        names.update(_reported(reported))
    if not names:
        return None
    listed = sorted(names)
    meant = suggestion(metric, listed)
    return (
        f"no trial has reported searcher metric '{metric}' (trials report {_listed(listed)})"
        + (f"; did you mean '{meant}'?" if meant else "")
        + " The searcher has no signal: nothing is pruned and the best trial is a guess."
    )
