"""The one way a service changes a trial's state: checked against core's transition table.

The check lives here, in the service layer, not in the database adapter: every repository (the
SQL one, a test's fake) gets only checked changes, and the adapter's compare-and-set on the
state the service saw catches a change made meanwhile by another writer (an API cancel racing
the control loop).
"""

from __future__ import annotations

from trainhub.core.errors import NotFound
from trainhub.core.states import TrialState, check_transition
from trainhub.service.records import KEEP, Trial, TrialUpdate
from trainhub.service.repository import TrialStore


def write_trial(
    repo: TrialStore, trial_id: int, update: TrialUpdate, current: TrialState | None = None
) -> Trial:
    """Write ``update``; a new state must be legal from ``current`` (read when not given)."""
    if update.state is KEEP:
        return repo.update_trial(trial_id, update)
    if current is None:
        found = repo.get_trial(trial_id)
        if found is None:
            raise NotFound(f"trial {trial_id} does not exist")
        current = found.state
    check_transition(current, update.state)
    return repo.update_trial(trial_id, update, expected_state=current)
