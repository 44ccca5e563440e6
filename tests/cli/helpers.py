"""Putting a trial into a given state through the repository, as the control loop would."""

from __future__ import annotations

import time
from typing import Any

from tests.cli.conftest import LiveServer
from tests.fixtures.api import make_context
from trainhub.core.states import TrialState
from trainhub.service.records import AttemptUpdate, TrialUpdate
from trainhub.service.trial_writes import write_trial

SPEC = "name: demo\nentrypoint: python train.py\nhyperparameters: {lr: 0.01}\n"
TIMING = {
    "time/step_s": 0.2,
    "time/forward_share": 0.25,
    "time/backward_share": 0.5,
    "time/sync_share": 0.2,
    "time/other_share": 0.05,
    "comm/bytes_per_step": 2.1e6,
    "throughput/samples_per_s": 640.0,
}


def submit(live: LiveServer, spec: str = SPEC) -> dict[str, Any]:
    r = live.api.client.post(
        "/api/v1/experiments",
        data={"spec": spec},
        files={"context": ("c.tar.gz", make_context({"train.py": b""}), "application/gzip")},
        headers=live.api.headers(),
    )
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def start(
    live: LiveServer, trial_id: int, placement: tuple[str, ...] = ("node-a", "node-a")
) -> int:
    """QUEUED -> SCHEDULED -> RUNNING with attempt 1; returns the attempt's row id."""
    now = time.time()
    with live.api.services.uow() as repo:
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.SCHEDULED, started_at=now))
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.RUNNING, pending_reason=None))
        attempt = repo.add_attempt(trial_id, 1, f"attempt-{trial_id}-1", placement, None, None, now)
        repo.update_attempt(attempt.id, AttemptUpdate(started_at=now))
        repo.update_trial(trial_id, TrialUpdate(num_attempts=1))
        return attempt.id


def report(live: LiveServer, trial_id: int, **fields: Any) -> None:
    """Columns a running trial reports (a misspelt one is a TypeError of TrialUpdate)."""
    with live.api.services.uow() as repo:
        repo.update_trial(trial_id, TrialUpdate(**fields))


def finish(
    live: LiveServer,
    trial_id: int,
    attempt_id: int,
    state: TrialState = TrialState.COMPLETED,
    message: str | None = None,
) -> None:
    now = time.time()
    outcome, codes = ("SUCCEEDED", (0, 0)) if state == TrialState.COMPLETED else ("FAILED", (0, 3))
    with live.api.services.uow() as repo:
        repo.update_attempt(
            attempt_id,
            AttemptUpdate(
                outcome=outcome,
                exit_codes=codes,
                ended_at=now,
                detail=None if outcome == "SUCCEEDED" else "rank 1 exited with 3",
            ),
        )
        write_trial(repo, trial_id, TrialUpdate(state=state, ended_at=now, message=message))
