"""Trial and experiment lifecycles: the states and the one table of legal transitions.

Every change of a trial's state goes through :func:`check_transition`; the control plane's
service layer is the only writer of the state column.
"""

from __future__ import annotations

from enum import StrEnum

from trainhub.core.errors import IllegalTransition


class TrialState(StrEnum):
    QUEUED = "QUEUED"  # waiting for the scheduler; carries a pending reason
    SCHEDULED = "SCHEDULED"  # resources granted, ranks being placed and started
    RUNNING = "RUNNING"  # every rank's process has started
    PREEMPTING = "PREEMPTING"  # asked to checkpoint and exit; goes back to QUEUED (or PAUSED)
    PAUSED = "PAUSED"  # held by a user; resumes from its latest checkpoint when unpaused
    COMPLETED = "COMPLETED"  # every rank exited 0
    FAILED = "FAILED"  # a rank failed and no restarts were left
    CANCELED = "CANCELED"  # stopped by a user
    PRUNED = "PRUNED"  # stopped early by a searcher

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def is_active(self) -> bool:
        """Holds (or is about to hold) cluster resources."""
        return self in (TrialState.SCHEDULED, TrialState.RUNNING, TrialState.PREEMPTING)


TERMINAL_STATES = frozenset(
    {TrialState.COMPLETED, TrialState.FAILED, TrialState.CANCELED, TrialState.PRUNED}
)

_T = TrialState
LEGAL_TRANSITIONS: dict[TrialState, frozenset[TrialState]] = {
    # QUEUED -> FAILED: its environment did not resolve or install (ADR 0026): no slot held
    _T.QUEUED: frozenset({_T.SCHEDULED, _T.PAUSED, _T.CANCELED, _T.FAILED}),
    # back to QUEUED when placement is lost before the ranks start; straight to an end when the
    # processes finish before the control plane saw them run
    _T.SCHEDULED: frozenset(
        {_T.RUNNING, _T.QUEUED, _T.PREEMPTING, _T.COMPLETED, _T.FAILED, _T.CANCELED}
    ),
    # RUNNING -> QUEUED is a restart after a failed attempt (max_restarts) or a lost node
    _T.RUNNING: frozenset(
        {_T.COMPLETED, _T.FAILED, _T.CANCELED, _T.PRUNED, _T.PREEMPTING, _T.QUEUED}
    ),
    # PRUNED: the searcher stopped it while the scheduler was preempting it
    _T.PREEMPTING: frozenset(
        {_T.QUEUED, _T.PAUSED, _T.COMPLETED, _T.FAILED, _T.CANCELED, _T.PRUNED}
    ),
    _T.PAUSED: frozenset({_T.QUEUED, _T.CANCELED}),
    _T.COMPLETED: frozenset(),
    _T.FAILED: frozenset(),
    _T.CANCELED: frozenset(),
    _T.PRUNED: frozenset(),
}


def check_transition(current: TrialState, target: TrialState) -> TrialState:
    """Return ``target`` if a trial may move there from ``current``; raise otherwise."""
    if target not in LEGAL_TRANSITIONS[current]:
        raise IllegalTransition(
            f"a trial in state {current} cannot move to {target}",
            hint=f"legal next states from {current}: "
            + (", ".join(sorted(LEGAL_TRANSITIONS[current])) or "none (it has ended)"),
        )
    return target


class AttemptOutcome(StrEnum):
    """How one attempt (one launch of all ranks of a trial) ended."""

    SUCCEEDED = "SUCCEEDED"  # every rank exited 0
    FAILED = "FAILED"  # a rank exited non-zero
    KILLED = "KILLED"  # stopped by the control plane (cancel)
    PREEMPTED = "PREEMPTED"  # checkpointed and exited on request of the scheduler
    LOST = "LOST"  # an actor or node died, the placement vanished, or the launch failed
    # the placement was not ready in time; nothing ran, so it is never charged as a restart
    UNPLACED = "UNPLACED"

    @property
    def ran(self) -> bool:
        """The attempt's processes may have run (its time counts as run time)."""
        return self != AttemptOutcome.UNPLACED


class ExperimentState(StrEnum):
    ACTIVE = "ACTIVE"  # some trial has not ended
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"


def experiment_state(trial_states: list[TrialState]) -> ExperimentState:
    """An experiment's state follows from its trials' states."""
    if not trial_states or any(not s.is_terminal for s in trial_states):
        return ExperimentState.ACTIVE
    if any(s == TrialState.FAILED for s in trial_states):
        return ExperimentState.FAILED
    if all(s == TrialState.CANCELED for s in trial_states):
        return ExperimentState.CANCELED
    return ExperimentState.COMPLETED


def trial_actions(state: TrialState) -> tuple[str, ...]:
    """What a user may ask of a trial in ``state`` (the buttons the dashboard offers): pause
    while it waits or runs, resume while paused, kill until it has ended."""
    if state.is_terminal:
        return ()
    actions: list[str] = []
    if state in (TrialState.QUEUED, TrialState.SCHEDULED, TrialState.RUNNING):
        actions.append("pause")
    if state == TrialState.PAUSED:
        actions.append("resume")
    return (*actions, "kill")


def experiment_actions(state: ExperimentState) -> tuple[str, ...]:
    """What a user may ask of an experiment: pause, resume and kill while it is ACTIVE (a
    search may be paused with no trial paused, so each stays offered), nothing once it ended."""
    return ("pause", "resume", "kill") if state == ExperimentState.ACTIVE else ()
