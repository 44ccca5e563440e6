from __future__ import annotations

import pytest

from trainhub.core.errors import IllegalTransition
from trainhub.core.states import (
    LEGAL_TRANSITIONS,
    TERMINAL_STATES,
    ExperimentState,
    TrialState,
    check_transition,
    experiment_state,
)


def test_every_state_has_a_row() -> None:
    assert set(LEGAL_TRANSITIONS) == set(TrialState)


def test_terminal_states_have_no_way_out() -> None:
    for state in TERMINAL_STATES:
        assert LEGAL_TRANSITIONS[state] == frozenset()
        with pytest.raises(IllegalTransition):
            check_transition(state, TrialState.QUEUED)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (TrialState.QUEUED, TrialState.SCHEDULED),
        (TrialState.SCHEDULED, TrialState.RUNNING),
        (TrialState.RUNNING, TrialState.PREEMPTING),
        (TrialState.PREEMPTING, TrialState.QUEUED),
        (TrialState.RUNNING, TrialState.QUEUED),  # restart after failure
        (TrialState.QUEUED, TrialState.PAUSED),
        (TrialState.PAUSED, TrialState.QUEUED),
    ],
)
def test_legal(current: TrialState, target: TrialState) -> None:
    assert check_transition(current, target) == target


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (TrialState.QUEUED, TrialState.RUNNING),  # must be scheduled first
        (TrialState.QUEUED, TrialState.COMPLETED),
        (TrialState.PAUSED, TrialState.RUNNING),
    ],
)
def test_illegal_names_legal_alternatives(current: TrialState, target: TrialState) -> None:
    with pytest.raises(IllegalTransition) as info:
        check_transition(current, target)
    assert "legal next states" in info.value.hint


def test_experiment_state_follows_trials() -> None:
    T = TrialState
    assert experiment_state([]) == ExperimentState.ACTIVE
    assert experiment_state([T.COMPLETED, T.RUNNING]) == ExperimentState.ACTIVE
    assert experiment_state([T.COMPLETED, T.FAILED]) == ExperimentState.FAILED
    assert experiment_state([T.CANCELED]) == ExperimentState.CANCELED
    assert experiment_state([T.COMPLETED, T.CANCELED]) == ExperimentState.COMPLETED
