"""Starting a trial's attempt by hand, as the control loop would (no Ray here)."""

from __future__ import annotations

from tests.fixtures.api import Api
from trainhub.core.states import TrialState
from trainhub.service.auth import new_token
from trainhub.service.records import TrialUpdate
from trainhub.service.trial_writes import write_trial


def start_attempt(api: Api, trial_id: int, number: int = 1) -> dict[str, str]:
    """Give the trial a running attempt ``number`` with its own token; return its headers."""
    secret, token_hash, prefix = new_token()
    with api.services.uow() as repo:
        token = repo.add_token(token_hash, prefix, "trial", 0.0, trial_id=trial_id)
        trial = repo.get_trial(trial_id)
        assert trial is not None
        if trial.state == TrialState.QUEUED:
            write_trial(repo, trial_id, TrialUpdate(state=TrialState.SCHEDULED))
            write_trial(repo, trial_id, TrialUpdate(state=TrialState.RUNNING, started_at=1.0))
        repo.add_attempt(trial_id, number, f"t{trial_id}-a{number}", ["node"], None, token.id, 1.0)
    return api.headers(secret)


def end_trial(api: Api, trial_id: int, state: TrialState = TrialState.COMPLETED) -> None:
    with api.services.uow() as repo:
        write_trial(repo, trial_id, TrialUpdate(state=state, ended_at=2.0))
