from __future__ import annotations

import pytest

from trainhub.core.errors import IllegalTransition
from trainhub.core.states import (
    LEGAL_TRANSITIONS,
    TERMINAL_STATES,
    ExperimentState,
    TrialState,
    check_transition,
    experiment_actions,
    experiment_state,
    trial_actions,
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


@pytest.mark.parametrize("state", list(TrialState))
def test_a_trial_offers_only_the_actions_its_transitions_allow(state: TrialState) -> None:
    """pause parks it (PAUSED) or stops it first (PREEMPTING), resume queues it, kill cancels
    it: each action offered is a legal move from ``state``, and an ended trial offers none."""
    actions = trial_actions(state)
    legal = LEGAL_TRANSITIONS[state]
    targets = {
        "pause": {TrialState.PAUSED, TrialState.PREEMPTING},
        "resume": {TrialState.QUEUED},
        "kill": {TrialState.CANCELED},
    }
    for action in actions:
        assert targets[action] & legal, (state, action)
    assert ("kill" in actions) == (not state.is_terminal)
    assert ("resume" in actions) == (state == TrialState.PAUSED)
    assert ("pause" in actions) == (
        state in (TrialState.QUEUED, TrialState.SCHEDULED, TrialState.RUNNING)
    )


def test_an_ended_experiment_offers_no_action() -> None:
    assert experiment_actions(ExperimentState.ACTIVE) == ("pause", "resume", "kill")
    for state in (ExperimentState.COMPLETED, ExperimentState.FAILED, ExperimentState.CANCELED):
        assert experiment_actions(state) == ()
