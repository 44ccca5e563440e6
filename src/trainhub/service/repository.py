"""The repository port: what the services need from the database, one role at a time.

A service asks for the role it uses (:class:`TrialStore`, :class:`AuthStore`, ...);
:class:`Repository` is all of them, which is what a unit of work yields. One implementation per
backend (``trainhub.adapters.db``: SQLite and PostgreSQL through SQLAlchemy); one contract test
suite (tests/adapters/test_repository_contract.py) runs against each. A unit of work is a context
manager yielding a :class:`Repository`; it commits when the block ends without an exception and
rolls back otherwise.

Updates are typed frozen values (``TrialUpdate``, ``AttemptUpdate``, ``TenantUpdate``). The
repository does not judge state changes: the service checks each against the transition table
(``trainhub.service.trial_writes``) and the repository writes it only if the row is still in
the state the service saw (compare and set), so a fake repository cannot skip the check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from trainhub.core.entitlement import Interval
from trainhub.core.layer_alerts import LayerAlert
from trainhub.core.scheduling.view import FINISHED_RUNS_READ
from trainhub.core.states import ExperimentState, TrialState
from trainhub.core.traffic import Flow, TrafficDelta
from trainhub.service.records import (
    ActiveChanges,
    ActiveRecord,
    Attempt,
    AttemptUpdate,
    AttemptUsage,
    Checkpoint,
    CheckpointTimes,
    Experiment,
    FinishedRun,
    LayerAlertRecord,
    MetricChunk,
    MetricPoint,
    MetricsTarget,
    RecordedTrial,
    SchedulingChanges,
    SchedulingRecord,
    Tenant,
    TenantUpdate,
    Token,
    TrafficRecord,
    TrafficUsage,
    Trial,
    TrialEvent,
    TrialOwner,
    TrialUpdate,
    User,
)


class TenantStore(Protocol):
    def add_tenant(self, name: str, now: float) -> Tenant: ...
    def get_tenant(self, name: str) -> Tenant | None: ...
    def list_tenants(self) -> list[Tenant]: ...
    def update_tenant(self, name: str, update: TenantUpdate) -> Tenant: ...


class AuthStore(Protocol):
    """Users, their memberships, and tokens (only hashes are stored)."""

    def add_user(self, username: str, is_admin: bool, now: float) -> User: ...
    def get_user(self, user_id: int) -> User | None: ...
    def get_user_by_name(self, username: str) -> User | None: ...
    def list_users(self) -> list[User]: ...
    def set_membership(self, user_id: int, tenant_name: str, role: str) -> None: ...
    def remove_membership(self, user_id: int, tenant_name: str) -> None: ...
    def add_token(
        self,
        token_hash: str,
        prefix: str,
        name: str,
        now: float,
        user_id: int | None = None,
        trial_id: int | None = None,
        expires_at: float | None = None,
    ) -> Token: ...
    def find_token(self, token_hash: str) -> Token | None: ...
    def get_token(self, token_id: int) -> Token | None: ...
    def list_tokens(self, user_id: int) -> list[Token]: ...
    def revoke_token(self, token_id: int) -> None: ...
    def touch_token(self, token_id: int, now: float) -> None: ...


class ExperimentStore(Protocol):
    def add_experiment(
        self,
        tenant: str,
        owner_id: int,
        name: str,
        project: str,
        spec: dict[str, Any],
        spec_yaml: str,
        context_size: int,
        now: float,
    ) -> Experiment: ...
    def set_experiment_context(self, experiment_id: int, context_key: str) -> None: ...
    def get_experiment(self, experiment_id: int) -> Experiment | None: ...
    def list_experiments(
        self,
        tenants: Iterable[str] | None,
        state: ExperimentState | None = None,
        limit: int = 50,
        offset: int = 0,
        *,
        project: str | None = None,
        name_contains: str | None = None,
        tenant: str | None = None,
        owner: str | None = None,
        sort: str = "created",
        order: str = "desc",
    ) -> tuple[list[Experiment], int]:
        """A page of experiments of ``tenants`` (None: all) and its total. ``tenant`` outside
        ``tenants`` gives none; ``sort`` is one of limits.EXPERIMENT_SORTS."""
        ...

    def offer_experiment_best(self, experiment_id: int, value: float, mode: str) -> None:
        """Store ``value`` as the best of the searcher's metric if it beats the stored one."""
        ...

    def set_experiment_state(
        self, experiment_id: int, state: ExperimentState, ended_at: float | None
    ) -> None: ...
    def experiment_of(self, trial_id: int) -> Experiment: ...
    def context_key(self, experiment_id: int) -> str | None:
        """Where the experiment's code is stored (None before it is, or without code)."""
        ...

    def experiment_specs(self, experiment_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """The spec of each of these experiments, in one query."""
        ...


class TrialStore(Protocol):
    def add_trial(
        self, experiment_id: int, hparams: dict[str, Any], priority: str, now: float
    ) -> Trial: ...
    def get_trial(self, trial_id: int) -> Trial | None: ...
    def list_trials(self, experiment_id: int) -> list[Trial]: ...
    def trial_states(self, experiment_id: int) -> list[TrialState]:
        """The state of each of the experiment's trials (a narrow read: an experiment's state
        is derived from them whenever one of its trials ends)."""
        ...

    def trials_in_states(self, states: Sequence[TrialState]) -> list[Trial]: ...
    def scheduling_records(self, states: Sequence[TrialState]) -> list[SchedulingRecord]:
        """The scheduling columns of the trials in these states, by id (a narrow read)."""
        ...

    def active_records(self, states: Sequence[TrialState]) -> list[ActiveRecord]:
        """What the control loop judges the attempts of the trials in these states by, by id
        (a narrow read)."""
        ...

    def active_changes(self, since: int | None) -> ActiveChanges:
        """What the attempts of the trials changed after change number ``since`` are judged by
        (any state); with None, of every active trial. Numbered as ``scheduling_changes``."""
        ...

    def scheduling_changes(self, since: int | None) -> SchedulingChanges:
        """The scheduling columns of the trials changed after change number ``since`` (any
        state); with None, of every queued and active trial. Changes are numbered at commit,
        and a number becomes visible only after every smaller one (ADR 0024)."""
        ...

    def update_trial(
        self, trial_id: int, update: TrialUpdate, expected_state: TrialState | None = None
    ) -> Trial:
        """Write ``update``; with ``expected_state``, only if the row is still in that state
        (raises ``Conflict`` otherwise). Does not check the transition: the service does."""
        ...

    def update_trials(self, updates: Sequence[tuple[int, TrialUpdate]]) -> None:
        """Write several updates that change no state, without reading the trials back."""
        ...


class AttemptStore(Protocol):
    def add_attempt(
        self,
        trial_id: int,
        number: int,
        key: str,
        placement: Sequence[str],
        restored_checkpoint_id: int | None,
        token_id: int | None,
        now: float,
        num_slots: int = 0,
    ) -> Attempt: ...
    def open_attempt(self, trial_id: int) -> Attempt | None: ...
    def open_attempts(self, trial_ids: Sequence[int]) -> dict[int, Attempt]:
        """The open attempt of each of these trials that has one, in one query."""
        ...

    def list_attempts(self, trial_id: int) -> list[Attempt]: ...
    def update_attempt(self, attempt_id: int, update: AttemptUpdate) -> Attempt: ...
    def count_outcomes(self, trial_ids: Sequence[int], outcome: str) -> dict[int, int]:
        """How many attempts of each trial ended with ``outcome``."""
        ...


class UsageStore(Protocol):
    """History read for accounting, fair share and the scheduler's estimates."""

    def attempt_usage(self, since: float) -> list[AttemptUsage]:
        """Attempts that held slots at some time after ``since`` (for accounting)."""
        ...

    def checkpoint_times(self, trial_ids: Sequence[int]) -> dict[int, CheckpointTimes]:
        """Per trial: its latest checkpoint's time, and the usual gap between checkpoints of
        its latest attempt that made any (deleted checkpoints count: they were made)."""
        ...

    def trial_owners(self, trial_ids: Sequence[int]) -> dict[int, TrialOwner]: ...
    def finished_runs(self, limit: int = FINISHED_RUNS_READ) -> list[FinishedRun]:
        """Run times of the latest ``limit`` COMPLETED trials that ran."""
        ...

    def trial_history(self, since: float | None = None) -> list[RecordedTrial]:
        """Every trial submitted at or after ``since`` (all when None), by submission."""
        ...

    def trial_demand(self, since: float) -> list[Interval]:
        """Trials that waited or ran at some time after ``since``: their tenant, the slots
        their spec asks for, and when they were submitted and ended (None: not yet)."""
        ...


class MetricStore(Protocol):
    """One row per (trial, step); a step reported again merges and replaces values."""

    def metrics_target(self, trial_id: int, attempt: int) -> MetricsTarget | None:
        """The trial a batch of ``attempt`` goes to, with what the batch is checked against
        (None: no such trial)."""
        ...

    def upsert_metrics(
        self,
        trial_id: int,
        attempt: int,
        points: Sequence[tuple[int, dict[str, float]]],
        now: float,
    ) -> None: ...
    def list_metrics(
        self, trial_id: int, after_step: int | None = None, limit: int = 10_000
    ) -> list[MetricPoint]: ...
    def list_metric_chunks(self, trial_id: int) -> list[MetricChunk]:
        """Every metric's points as packed chunks, in ingestion order (charts' first read)."""
        ...

    def count_metrics(self, trial_id: int) -> int:
        """Rows (steps) of the trial's metrics."""
        ...


class CheckpointStore(Protocol):
    def add_checkpoint(
        self,
        trial_id: int,
        uuid: str,
        step: int,
        attempt: int,
        metrics: dict[str, Any],
        storage_key: str,
        size_bytes: int,
        now: float,
    ) -> Checkpoint: ...
    def get_checkpoint_by_uuid(self, uuid: str) -> Checkpoint | None: ...
    def get_checkpoint(self, checkpoint_id: int) -> Checkpoint | None: ...
    def list_checkpoints(self, trial_id: int) -> list[Checkpoint]: ...
    def mark_checkpoint_deleted(self, checkpoint_id: int) -> None: ...
    def checkpoint_bytes_by_tenant(self) -> dict[str, int]:
        """Bytes of the kept (not deleted) checkpoints of each tenant that has any."""
        ...


class EventStore(Protocol):
    """Trial events: the audit trail `trainhub show` prints."""

    def add_event(self, trial_id: int, kind: str, message: str, now: float) -> None: ...
    def list_events(self, trial_id: int, limit: int = 100) -> list[TrialEvent]: ...


class LayerAlertStore(Protocol):
    """Layer-health alerts: one per (trial, kind, layer), with the first and last step."""

    def record_layer_alerts(
        self, trial_id: int, alerts: Sequence[LayerAlert], now: float
    ) -> None: ...
    def list_layer_alerts(self, trial_id: int, limit: int = 1000) -> list[LayerAlertRecord]:
        """Earliest first."""
        ...


class WriteQuotaStore(Protocol):
    """What a trial wrote beyond the API's checkpoints (issue 24): metric points stored and
    dropped over the trial's cap, and the bytes its nodes measured in its folders."""

    def add_metric_counts(self, trial_id: int, stored: int, dropped: int) -> None: ...
    def record_disk_bytes(self, sizes: Mapping[int, int]) -> None:
        """Trial id -> bytes of its checkpoint folder, home and scratch, as last measured."""
        ...

    def disk_bytes_by_tenant(self) -> dict[str, int]: ...
    def checkpoint_bytes_of(self, trial_ids: Sequence[int]) -> dict[int, int]:
        """Bytes of each trial's kept checkpoints (trials without any left out)."""
        ...


class TrafficStore(Protocol):
    """The network bytes of attempts' ranks per scope and UTC day (issue 30; written by the
    control loop only, service/traffic.py)."""

    def add_traffic(
        self, day: str, trial_of: dict[int, int], deltas: Sequence[TrafficDelta]
    ) -> None:
        """Add ``deltas`` to ``day``'s rows (``trial_of``: attempt id -> trial id)."""
        ...

    def traffic_totals(self, attempt_ids: Sequence[int]) -> dict[int, dict[tuple[int, str], Flow]]:
        """Per attempt, (rank, scope) -> its bytes so far."""
        ...

    def traffic_usage(self, since_day: str, until_day: str) -> list[TrafficUsage]: ...
    def trial_traffic(self, trial_id: int) -> list[TrafficRecord]: ...
    def traffic_by_trial(self) -> list[tuple[str, int, str, int, int]]:
        """(tenant, trial id, scope, sent, received) over all time."""
        ...


class Repository(
    TenantStore,
    AuthStore,
    ExperimentStore,
    TrialStore,
    AttemptStore,
    UsageStore,
    MetricStore,
    CheckpointStore,
    EventStore,
    LayerAlertStore,
    WriteQuotaStore,
    TrafficStore,
    Protocol,
):
    """Every role: what one unit of work yields."""


UnitOfWork = Callable[[], AbstractContextManager[Repository]]
