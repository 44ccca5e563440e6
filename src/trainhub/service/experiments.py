"""Use cases of experiments and trials: submit, list, show, cancel.

Submitting writes rows and the context and returns at once; the control loop starts the trial.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from trainhub.core.errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from trainhub.core.spec import ExperimentSpec, Priority, check_entrypoint_exists, parse_spec
from trainhub.core.states import ExperimentState, TrialState, experiment_state
from trainhub.service.auth import (
    check_read,
    check_write,
    choose_tenant,
    require_user,
    visible_tenants,
)
from trainhub.service.clock import Clock
from trainhub.service.context_archive import DEFAULT_MAX_CONTEXT_BYTES, check_context
from trainhub.service.keys import context_key
from trainhub.service.ports import ArtifactStore, Principal
from trainhub.service.records import Attempt, Checkpoint, Experiment, Trial, TrialEvent, TrialUpdate
from trainhub.service.repository import ExperimentStore, TrialStore, UnitOfWork
from trainhub.service.trial_writes import write_trial


@dataclass(frozen=True)
class ExperimentDetail:
    experiment: Experiment
    trials: list[Trial]


@dataclass(frozen=True)
class TrialDetail:
    trial: Trial
    experiment: Experiment
    attempts: list[Attempt]
    checkpoints: list[Checkpoint]
    events: list[TrialEvent]


class _TrialsOfExperiments(TrialStore, ExperimentStore, Protocol):
    """The roles refresh_experiment_state uses."""


def refresh_experiment_state(repo: _TrialsOfExperiments, experiment_id: int, now: float) -> None:
    """Derive the experiment's state from its trials (after a trial ended)."""
    states = [t.state for t in repo.list_trials(experiment_id)]
    state = experiment_state(states)
    repo.set_experiment_state(
        experiment_id, state, now if state != ExperimentState.ACTIVE else None
    )


class ExperimentService:
    def __init__(
        self,
        uow: UnitOfWork,
        store: ArtifactStore,
        clock: Clock,
        wake_scheduler: Callable[[], None] = lambda: None,
        max_context_bytes: int = DEFAULT_MAX_CONTEXT_BYTES,
    ) -> None:
        self.uow = uow
        self.store = store
        self.clock = clock
        self.wake_scheduler = wake_scheduler
        self.max_context_bytes = max_context_bytes

    def submit(
        self, principal: Principal, spec_yaml: str, context: bytes | None, tenant: str | None
    ) -> ExperimentDetail:
        spec = parse_spec(spec_yaml)
        files = check_context(context, self.max_context_bytes) if context else set()
        check_entrypoint_exists(spec, files)
        tenant_name = choose_tenant(principal, tenant)
        check_write(principal, tenant_name, f"tenant {tenant_name!r}")
        if spec.priority == Priority.URGENT and not principal.is_admin:
            raise PermissionDenied(
                "only cluster admins may submit with priority 'urgent'", "use 'high'"
            )
        assert principal.user_id is not None
        now = self.clock()
        with self.uow() as repo:
            if repo.get_tenant(tenant_name) is None:
                raise NotFound(f"tenant {tenant_name!r} does not exist")
            experiment = repo.add_experiment(
                tenant=tenant_name,
                owner_id=principal.user_id,
                name=spec.name,
                project=spec.project,
                spec=spec.model_dump(mode="json"),
                spec_yaml=spec_yaml,
                context_size=len(context or b""),
                now=now,
            )
            if context:
                key = context_key(tenant_name, experiment.id)
                self.store.put(key, context)
                repo.set_experiment_context(experiment.id, key)
            trial = repo.add_trial(experiment.id, dict(spec.hyperparameters), spec.priority, now)
            repo.add_event(trial.id, "submitted", f"submitted by {principal.username}", now)
            detail = ExperimentDetail(_must(repo.get_experiment(experiment.id)), [trial])
        self.wake_scheduler()
        return detail

    def list_experiments(
        self,
        principal: Principal,
        state: ExperimentState | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[Experiment], int]:
        require_user(principal)
        with self.uow() as repo:
            return repo.list_experiments(visible_tenants(principal), state, limit, offset)

    def get(self, principal: Principal, experiment_id: int) -> ExperimentDetail:
        require_user(principal)
        with self.uow() as repo:
            experiment = repo.get_experiment(experiment_id)
            if experiment is None:
                raise NotFound(f"experiment {experiment_id} does not exist")
            check_read(principal, experiment.tenant, f"experiment {experiment_id}")
            return ExperimentDetail(experiment, repo.list_trials(experiment_id))

    def get_trial(self, principal: Principal, trial_id: int) -> TrialDetail:
        require_user(principal)
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
            if trial is None:
                raise NotFound(f"trial {trial_id} does not exist")
            check_read(principal, trial.tenant, f"trial {trial_id}")
            return TrialDetail(
                trial,
                repo.experiment_of(trial_id),
                repo.list_attempts(trial_id),
                repo.list_checkpoints(trial_id),
                repo.list_events(trial_id),
            )

    def cancel_experiment(self, principal: Principal, experiment_id: int) -> ExperimentDetail:
        detail = self.get(principal, experiment_id)
        check_write(principal, detail.experiment.tenant, f"experiment {experiment_id}")
        for trial in detail.trials:
            if not trial.state.is_terminal:
                self.cancel_trial(principal, trial.id)
        return self.get(principal, experiment_id)

    def cancel_trial(self, principal: Principal, trial_id: int) -> Trial:
        require_user(principal)
        now = self.clock()
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
            if trial is None:
                raise NotFound(f"trial {trial_id} does not exist")
            check_write(principal, trial.tenant, f"trial {trial_id}")
            if trial.state == TrialState.CANCELED:
                return trial
            if trial.state.is_terminal:
                raise Conflict(f"trial {trial_id} already ended ({trial.state})")
            reason = f"canceled by {principal.username}"
            if trial.state in (TrialState.QUEUED, TrialState.PAUSED):
                trial = write_trial(
                    repo,
                    trial_id,
                    TrialUpdate(
                        state=TrialState.CANCELED,
                        ended_at=now,
                        pending_reason=None,
                        message=reason,
                    ),
                    current=trial.state,
                )
                refresh_experiment_state(repo, trial.experiment_id, now)
            else:
                # the control loop ends the processes and then records CANCELED
                trial = repo.update_trial(
                    trial_id, TrialUpdate(cancel_requested=True, stop_reason=reason)
                )
            repo.add_event(trial_id, "cancel", reason, now)
        self.wake_scheduler()
        return trial

    def set_priority(self, principal: Principal, trial_id: int, priority: str) -> Trial:
        """Change a trial's priority; the scheduler uses it from its next tick."""
        require_user(principal)
        try:
            level = Priority(priority)
        except ValueError:
            raise InvalidRequest(
                f"priority {priority!r} does not exist", "use low, normal, high or urgent"
            ) from None
        if level == Priority.URGENT and not principal.is_admin:
            raise PermissionDenied("only cluster admins may set priority 'urgent'", "use 'high'")
        now = self.clock()
        with self.uow() as repo:
            trial = repo.get_trial(trial_id)
            if trial is None:
                raise NotFound(f"trial {trial_id} does not exist")
            check_write(principal, trial.tenant, f"trial {trial_id}")
            if trial.state.is_terminal:
                raise Conflict(f"trial {trial_id} already ended ({trial.state})")
            trial = repo.update_trial(trial_id, TrialUpdate(priority=level.value))
            repo.add_event(
                trial_id, "priority", f"priority set to {level} by {principal.username}", now
            )
        self.wake_scheduler()
        return trial

    def queue(self, principal: Principal) -> list[Trial]:
        """Queued trials one may see, in the order the scheduler would start them."""
        require_user(principal)
        allowed = visible_tenants(principal)
        with self.uow() as repo:
            queued = repo.trials_in_states([TrialState.QUEUED, TrialState.PAUSED])
        visible = [t for t in queued if allowed is None or t.tenant in allowed]
        return sorted(
            visible,
            key=lambda t: (t.queue_position is None, t.queue_position or 0, t.submitted_at, t.id),
        )

    def spec_of(self, experiment: Experiment) -> ExperimentSpec:
        return ExperimentSpec.model_validate(experiment.spec)


def _must(value: Experiment | None) -> Experiment:
    assert value is not None
    return value
