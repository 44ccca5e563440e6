"""Plain records the repository returns, and the typed updates it accepts.

Times are UTC unix seconds. An update is a frozen value naming the columns to change; a field
left at :data:`KEEP` is not written, so a misspelt column is a type error, not a silent no-op.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Literal, NamedTuple

from trainhub.core.states import ExperimentState, TrialState


@dataclass(frozen=True)
class Tenant:
    id: int
    name: str
    guaranteed_slots: int = 0
    limit_slots: int | None = None
    weight: float = 1.0
    # storage quotas set by admins; None: the server's default
    max_checkpoint_bytes: int | None = None
    max_trial_storage_bytes: int | None = None
    max_storage_bytes: int | None = None


@dataclass(frozen=True)
class User:
    id: int
    username: str
    is_admin: bool
    active: bool
    roles: dict[str, str] = field(default_factory=dict)  # tenant name -> role


@dataclass(frozen=True)
class Token:
    id: int
    prefix: str
    name: str
    user_id: int | None
    trial_id: int | None
    created_at: float
    expires_at: float | None
    revoked: bool
    last_used_at: float | None


@dataclass(frozen=True)
class Experiment:
    id: int
    tenant: str
    owner: str
    name: str
    project: str
    state: ExperimentState
    spec: dict[str, Any]
    spec_yaml: str
    context_key: str | None
    context_size: int
    created_at: float
    ended_at: float | None
    trial_ids: tuple[int, ...] = ()
    # best value of the searcher's metric reported by any of its trials (None: none yet)
    best_value: float | None = None


@dataclass(frozen=True)
class Trial:
    id: int
    experiment_id: int
    tenant: str
    state: TrialState
    hparams: dict[str, Any]
    priority: str
    submitted_at: float
    queued_at: float
    started_at: float | None
    ended_at: float | None
    pending_reason: str | None
    num_attempts: int
    num_restarts: int
    stop_reason: str | None
    cancel_requested: bool
    latest_metrics: dict[str, Any]
    progress: dict[str, Any]
    message: str | None
    queue_position: int | None = None
    # seconds the trial's attempts have run, and the slot-seconds they held while running
    # (least attained service); both grow when an attempt ends
    run_time_s: float = 0.0
    attained_service: float = 0.0
    # run time its latest checkpoint holds: where the next attempt resumes
    progress_s: float = 0.0
    # metric points stored, and dropped over the trial's cap; bytes its nodes measured in its
    # checkpoint folder, home and scratch (issue 24)
    metric_points: int = 0
    metric_points_dropped: int = 0
    disk_bytes: int = 0


class SchedulingRecord(NamedTuple):
    """The columns of a queued or active trial that the control loop reads every tick to
    schedule: a narrow read (no JSON columns, about a tenth of the cost of whole trials with
    thousands queued); the whole trial is read only for the trials it starts. The last two
    are the pending note the loop last wrote, not facts of the scheduler."""

    id: int
    experiment_id: int
    tenant: str
    state: TrialState
    priority: str
    submitted_at: float
    queued_at: float
    attained_service: float
    progress_s: float
    pending_reason: str | None
    queue_position: int | None


class ActiveRecord(NamedTuple):
    """The columns of an active trial the control loop reads every tick to judge its attempt:
    a narrow read like :class:`SchedulingRecord`; the whole trial is read for a trial whose
    attempt ends."""

    id: int
    experiment_id: int
    tenant: str
    state: TrialState
    cancel_requested: bool
    stop_reason: str | None
    started_at: float | None


class SchedulingChanges(NamedTuple):
    """What changed for the scheduler since a change number (``Repository.scheduling_changes``).

    ``records``: with ``whole``, every queued and active trial (a first read, or a resync);
    else every trial whose scheduling columns, attempts or checkpoints changed since the number
    asked for, in whatever state it is now (one that left the queue or ended says so).
    ``mark``: the number to ask from at the next read.
    """

    records: list[SchedulingRecord]
    mark: int
    whole: bool


class ActiveChanges(NamedTuple):
    """What changed for the observation of attempts since a change number
    (``Repository.active_changes``).

    ``records``: with ``whole``, every active trial (a first read, or a resync); else every
    trial whose numbered columns, attempts or checkpoints changed since the number asked for,
    in whatever state it is now (one that is no longer active says so). ``mark``: the number
    to ask from at the next read.
    """

    records: list[ActiveRecord]
    mark: int
    whole: bool


@dataclass(frozen=True)
class Attempt:
    id: int
    trial_id: int
    number: int
    key: str
    placement: tuple[str, ...]
    restored_checkpoint_id: int | None
    token_id: int | None
    outcome: str | None
    exit_codes: tuple[int | None, ...]
    detail: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    num_slots: int = 0
    # stopping (preemption, cancel): when should_stop() turned on, when SIGTERM went out
    stop_requested_at: float | None = None
    terminate_sent_at: float | None = None

    @property
    def run_time_s(self) -> float:
        """Seconds the processes ran (0 if they never started); open attempts count nothing."""
        if self.started_at is None or self.ended_at is None:
            return 0.0
        return max(0.0, self.ended_at - self.started_at)


@dataclass(frozen=True)
class TrafficUsage:
    """Network bytes of one tenant, user and project on one UTC day, in one scope."""

    day: str
    tenant: str
    user: str
    project: str
    scope: str  # inter-node | intra-node (core/traffic.py)
    sent_bytes: int
    received_bytes: int


@dataclass(frozen=True)
class TrafficRecord:
    """Network bytes of one rank of one attempt of a trial, in one scope, so far."""

    attempt: int  # the attempt's number
    rank: int
    scope: str
    sent_bytes: int
    received_bytes: int
    source: str  # kernel | hooks: the source attributed (docs/adr/0045)


@dataclass(frozen=True)
class AttemptUsage:
    """Slots one attempt held from ``start`` to ``end`` (None: still holds them)."""

    tenant: str
    user: str
    project: str
    trial_id: int
    num_slots: int
    start: float
    end: float | None


@dataclass(frozen=True)
class Checkpoint:
    id: int
    trial_id: int
    uuid: str
    step: int
    attempt: int
    metrics: dict[str, Any]
    storage_key: str
    size_bytes: int
    created_at: float


@dataclass(frozen=True)
class MetricPoint:
    step: int
    attempt: int
    values: dict[str, float]
    reported_at: float


@dataclass(frozen=True)
class MetricChunk:
    """One metric's points from one ingested batch, packed: ``steps`` little-endian int64,
    ``values`` little-endian float64, ``num_points`` of each. Chunks in ingestion order; a
    later chunk's value of a step replaces an earlier one's."""

    name: str
    attempt: int
    num_points: int
    steps: bytes
    values: bytes


@dataclass(frozen=True)
class MetricsTarget:
    """What a batch of metrics is checked against and merged into, read in one query: every
    runtime reports through this path, so it reads no more than it needs."""

    trial_id: int
    experiment_id: int
    tenant: str
    state: TrialState
    latest_metrics: dict[str, Any]
    has_attempt: bool  # the trial has the attempt the batch names
    searcher: dict[str, Any] | None  # the experiment spec's ``searcher`` section
    metric_points: int = 0  # points stored so far (the trial's total cap counts them)
    disk_bytes: int = 0  # its folders on its nodes, as last measured
    max_trial_storage_bytes: int | None = None  # the tenant's quota per trial (None: default)


@dataclass(frozen=True)
class TrialEvent:
    time: float
    kind: str
    message: str


# ---------------------------------------------------------------- typed updates


class Keep(Enum):
    """The type of :data:`KEEP`: leave this column as it is."""

    KEEP = "keep"


KEEP: Literal[Keep.KEEP] = Keep.KEEP


def changes_of(update: object) -> dict[str, Any]:
    """The fields of a typed update (a frozen dataclass) that are not :data:`KEEP`, by name."""
    names = _FIELD_NAMES.get(type(update))
    if names is None:
        names = _FIELD_NAMES[type(update)] = tuple(
            f.name
            for f in fields(update)  # type: ignore[arg-type]
        )
    return {name: value for name in names if (value := getattr(update, name)) is not KEEP}


# each update type's field names (dataclasses.fields() is slow in a tick's thousand updates)
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialUpdate:
    """Columns of a trial to change. A new ``state`` must be checked against the transition
    table first (``trainhub.service.trial_writes.write_trial`` does)."""

    state: TrialState | Keep = KEEP
    pending_reason: str | Keep | None = KEEP
    queue_position: int | Keep | None = KEEP
    message: str | Keep | None = KEEP
    stop_reason: str | Keep | None = KEEP
    cancel_requested: bool | Keep = KEEP
    priority: str | Keep = KEEP
    queued_at: float | Keep = KEEP
    started_at: float | Keep | None = KEEP
    ended_at: float | Keep | None = KEEP
    num_attempts: int | Keep = KEEP
    num_restarts: int | Keep = KEEP
    latest_metrics: dict[str, Any] | Keep = KEEP
    progress: dict[str, Any] | Keep = KEEP
    run_time_s: float | Keep = KEEP
    attained_service: float | Keep = KEEP
    progress_s: float | Keep = KEEP

    def changes(self) -> dict[str, Any]:
        """The columns this update writes, by name."""
        return changes_of(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptUpdate:
    """Columns of an attempt to change."""

    outcome: str | Keep | None = KEEP
    detail: str | Keep | None = KEEP
    exit_codes: tuple[int | None, ...] | Keep = KEEP
    started_at: float | Keep | None = KEEP
    ended_at: float | Keep | None = KEEP
    stop_requested_at: float | Keep | None = KEEP
    terminate_sent_at: float | Keep | None = KEEP

    def changes(self) -> dict[str, Any]:
        return changes_of(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantUpdate:
    """A tenant's share (slots) and storage quotas to change."""

    guaranteed_slots: int | Keep = KEEP
    limit_slots: int | Keep | None = KEEP
    weight: float | Keep = KEEP
    # storage quotas in bytes; None: the server's default
    max_checkpoint_bytes: int | Keep | None = KEEP
    max_trial_storage_bytes: int | Keep | None = KEEP
    max_storage_bytes: int | Keep | None = KEEP

    def changes(self) -> dict[str, Any]:
        return changes_of(self)


# ---------------------------------------------------------------- scheduler facts


@dataclass(frozen=True)
class CheckpointTimes:
    """When one trial's latest checkpoint was registered, and the usual gap between its
    checkpoints within one attempt (None until an attempt made two)."""

    trial_id: int
    attempt: int
    last_at: float
    interval_s: float | None


@dataclass(frozen=True)
class TrialOwner:
    """Who submitted a trial, and in which project."""

    trial_id: int
    user: str
    project: str


@dataclass(frozen=True)
class FinishedRun:
    """The run time of one completed trial (what expected durations are estimated from)."""

    user: str
    project: str
    run_time_s: float


@dataclass(frozen=True)
class RecordedTrial:
    """What the database recorded of one trial: its arrival, its shape, how long it ran, and
    what happened to it (``trainhub sim --replay`` re-runs these through any policy)."""

    trial_id: int
    tenant: str
    user: str
    project: str
    priority: str
    state: TrialState
    spec: dict[str, Any]  # the experiment's spec (its resources give the trial's shape)
    submitted_at: float
    first_start_at: float | None  # when its first attempt got its resources
    ended_at: float | None
    run_time_s: float
    num_preemptions: int


@dataclass(frozen=True)
class LayerAlertRecord:
    """A layer-health alert as kept: the first step it fired at (with its value and message
    then) and the last."""

    kind: str
    layer: str
    first_step: int
    last_step: int
    value: float | None
    message: str
    first_at: float
    last_at: float
