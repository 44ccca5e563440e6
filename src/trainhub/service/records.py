"""Plain records the repository returns. Times are UTC unix seconds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
class TrialEvent:
    time: float
    kind: str
    message: str
