"""The facts :func:`trainhub.core.failures.judge_failure` needs about a failed attempt, read
from the database and the stored logs (the control loop asks when an attempt ends FAILED)."""

from __future__ import annotations

from trainhub.core.failures import FailureFacts, FailureVerdict, judge_failure
from trainhub.core.states import AttemptOutcome
from trainhub.service.keys import log_key
from trainhub.service.ports import ArtifactStore
from trainhub.service.records import Attempt, Trial
from trainhub.service.repository import Repository

LOG_TAIL_BYTES = 4096


def log_tail(store: ArtifactStore, trial: Trial, number: int, rank: int) -> str:
    """The last few KB of one rank's output of one attempt ('' when it wrote none)."""
    key = log_key(trial.tenant, trial.id, number, rank)
    if not store.exists(key):
        return ""
    data = store.read_range(key, max(0, store.size(key) - LOG_TAIL_BYTES))
    return data.decode(errors="replace")


def _facts(
    store: ArtifactStore,
    trial: Trial,
    number: int,
    exit_codes: tuple[int | None, ...],
    reported: bool,
) -> FailureFacts | None:
    failed = [(rank, code) for rank, code in enumerate(exit_codes) if code not in (0, None)]
    if not failed:
        return None
    rank, code = failed[0]
    return FailureFacts(code, log_tail(store, trial, number, rank), reported)


def judge_failed_attempt(
    repo: Repository,
    store: ArtifactStore,
    trial: Trial,
    attempt: Attempt,
    exit_codes: tuple[int | None, ...],
) -> FailureVerdict | None:
    """Whether the failed ``attempt`` is retried, from its first failed rank's log tail and the
    attempt before it; None where no rank exited with an error code (nothing to judge).

    "Before its first report" is read from the trial's metrics: a trial that has reported
    nothing yet had no attempt that reported (an attempt that reported and then failed makes
    the trial's later failures retried as usual)."""
    reported = any(name != "step" for name in trial.latest_metrics)
    current = _facts(store, trial, attempt.number, exit_codes, reported)
    if current is None:
        return None
    previous: FailureFacts | None = None
    earlier = [a for a in repo.list_attempts(trial.id) if a.number == attempt.number - 1]
    if earlier and earlier[0].outcome == AttemptOutcome.FAILED.value:
        previous = _facts(store, trial, earlier[0].number, earlier[0].exit_codes, reported)
    return judge_failure(current, previous)
