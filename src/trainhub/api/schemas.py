"""Request and response bodies: XCreate / XUpdate / XPublic / XsPublic{data, count}."""

from __future__ import annotations

import base64
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trainhub.core.resources import Node
from trainhub.core.states import ExperimentState, TrialState
from trainhub.service import records
from trainhub.service.experiments import ExperimentDetail, TrialDetail
from trainhub.service.tracking import LogChunk


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExperimentPublic(BaseModel):
    id: int
    name: str
    project: str
    tenant: str
    owner: str
    state: ExperimentState
    created_at: float
    ended_at: float | None
    trial_ids: list[int]

    @classmethod
    def of(cls, e: records.Experiment) -> ExperimentPublic:
        return cls(
            id=e.id,
            name=e.name,
            project=e.project,
            tenant=e.tenant,
            owner=e.owner,
            state=e.state,
            created_at=e.created_at,
            ended_at=e.ended_at,
            trial_ids=list(e.trial_ids),
        )


class TrialPublic(BaseModel):
    id: int
    experiment_id: int
    tenant: str
    state: TrialState
    priority: str
    hparams: dict[str, Any]
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    pending_reason: str | None
    num_attempts: int
    num_restarts: int
    latest_metrics: dict[str, Any]
    progress: dict[str, Any]
    message: str | None
    stop_requested: str | None
    queue_position: int | None = None

    @classmethod
    def of(cls, t: records.Trial) -> TrialPublic:
        return cls(
            id=t.id,
            experiment_id=t.experiment_id,
            tenant=t.tenant,
            state=t.state,
            priority=t.priority,
            hparams=t.hparams,
            submitted_at=t.submitted_at,
            started_at=t.started_at,
            ended_at=t.ended_at,
            pending_reason=t.pending_reason,
            num_attempts=t.num_attempts,
            num_restarts=t.num_restarts,
            latest_metrics=t.latest_metrics,
            progress=t.progress,
            message=t.message,
            stop_requested=t.stop_reason if t.cancel_requested or t.stop_reason else None,
            queue_position=t.queue_position,
        )


class ExperimentDetailPublic(ExperimentPublic):
    spec: dict[str, Any]
    trials: list[TrialPublic]

    @classmethod
    def of_detail(cls, d: ExperimentDetail) -> ExperimentDetailPublic:
        base = ExperimentPublic.of(d.experiment).model_dump()
        return cls(**base, spec=d.experiment.spec, trials=[TrialPublic.of(t) for t in d.trials])


class ExperimentsPublic(BaseModel):
    data: list[ExperimentPublic]
    count: int


class AttemptPublic(BaseModel):
    number: int
    placement: list[str]
    outcome: str | None
    exit_codes: list[int | None]
    detail: str | None
    restored_checkpoint_id: int | None
    created_at: float
    started_at: float | None
    ended_at: float | None

    @classmethod
    def of(cls, a: records.Attempt) -> AttemptPublic:
        return cls(
            number=a.number,
            placement=list(a.placement),
            outcome=a.outcome,
            exit_codes=list(a.exit_codes),
            detail=a.detail,
            restored_checkpoint_id=a.restored_checkpoint_id,
            created_at=a.created_at,
            started_at=a.started_at,
            ended_at=a.ended_at,
        )


class CheckpointPublic(BaseModel):
    id: int
    uuid: str
    step: int
    attempt: int
    metrics: dict[str, Any]
    size_bytes: int
    created_at: float

    @classmethod
    def of(cls, c: records.Checkpoint) -> CheckpointPublic:
        return cls(
            id=c.id,
            uuid=c.uuid,
            step=c.step,
            attempt=c.attempt,
            metrics=c.metrics,
            size_bytes=c.size_bytes,
            created_at=c.created_at,
        )


class CheckpointsPublic(BaseModel):
    data: list[CheckpointPublic]
    count: int


class EventPublic(BaseModel):
    time: float
    kind: str
    message: str


class TrialDetailPublic(TrialPublic):
    experiment_name: str
    attempts: list[AttemptPublic]
    checkpoints: list[CheckpointPublic]
    events: list[EventPublic]

    @classmethod
    def of_detail(cls, d: TrialDetail) -> TrialDetailPublic:
        return cls(
            **TrialPublic.of(d.trial).model_dump(),
            experiment_name=d.experiment.name,
            attempts=[AttemptPublic.of(a) for a in d.attempts],
            checkpoints=[CheckpointPublic.of(c) for c in d.checkpoints],
            events=[EventPublic(time=e.time, kind=e.kind, message=e.message) for e in d.events],
        )


class MetricPointIn(_In):
    step: int = Field(ge=0)
    values: dict[str, float]
    time: float | None = None


class ProgressIn(_In):
    current: float
    total: float | None = None
    unit: str = "steps"


class MetricsBatchIn(_In):
    attempt: int = Field(1, ge=1)
    points: list[MetricPointIn] = Field(default_factory=list, max_length=100_000)
    progress: ProgressIn | None = None


class MetricPointPublic(BaseModel):
    step: int
    attempt: int
    values: dict[str, float]
    reported_at: float


class MetricsPublic(BaseModel):
    data: list[MetricPointPublic]
    count: int


class SignalsPublic(BaseModel):
    should_stop: bool
    reason: str | None


class LogChunkPublic(BaseModel):
    attempt: int
    rank: int
    offset: int
    next_offset: int
    data_b64: str = Field(description="The bytes of the log from offset, base64-encoded.")
    text: str = Field(description="The same bytes decoded as UTF-8 (invalid bytes replaced).")
    complete: bool

    @classmethod
    def of(cls, chunk: LogChunk) -> LogChunkPublic:
        return cls(
            attempt=chunk.attempt,
            rank=chunk.rank,
            offset=chunk.offset,
            next_offset=chunk.next_offset,
            data_b64=base64.b64encode(chunk.data).decode(),
            text=chunk.data.decode("utf-8", errors="replace"),
            complete=chunk.complete,
        )


class TenantCreate(_In):
    name: str
    guaranteed_slots: int = Field(0, ge=0)
    limit_slots: int | None = Field(None, ge=0)
    weight: float = Field(1.0, gt=0)


class TenantUpdate(_In):
    guaranteed_slots: int | None = Field(None, ge=0)
    limit_slots: int | None = Field(None, ge=0)
    weight: float | None = Field(None, gt=0)
    clear_limit: bool = False


class TenantPublic(BaseModel):
    name: str
    guaranteed_slots: int
    limit_slots: int | None
    weight: float

    @classmethod
    def of(cls, t: records.Tenant) -> TenantPublic:
        return cls(
            name=t.name,
            guaranteed_slots=t.guaranteed_slots,
            limit_slots=t.limit_slots,
            weight=t.weight,
        )


class TenantsPublic(BaseModel):
    data: list[TenantPublic]
    count: int


class UserCreate(_In):
    username: str
    is_admin: bool = False


class MembershipSet(_In):
    tenant: str
    role: str = Field("member", description="admin, member or viewer")


class UserPublic(BaseModel):
    id: int
    username: str
    is_admin: bool
    active: bool
    roles: dict[str, str]

    @classmethod
    def of(cls, u: records.User) -> UserPublic:
        return cls(
            id=u.id, username=u.username, is_admin=u.is_admin, active=u.active, roles=u.roles
        )


class UsersPublic(BaseModel):
    data: list[UserPublic]
    count: int


class TokenCreate(_In):
    name: str = ""
    username: str | None = Field(None, description="Admins: issue for another user.")
    ttl_s: float | None = Field(None, gt=0)


class TokenPublic(BaseModel):
    id: int
    prefix: str
    name: str
    created_at: float
    expires_at: float | None
    revoked: bool
    last_used_at: float | None

    @classmethod
    def of(cls, t: records.Token) -> TokenPublic:
        return cls(
            id=t.id,
            prefix=t.prefix,
            name=t.name,
            created_at=t.created_at,
            expires_at=t.expires_at,
            revoked=t.revoked,
            last_used_at=t.last_used_at,
        )


class TokenIssued(TokenPublic):
    token: str = Field(description="The secret. Shown this once; store it now.")


class TokensPublic(BaseModel):
    data: list[TokenPublic]
    count: int


class MePublic(BaseModel):
    username: str
    is_admin: bool
    roles: dict[str, str]


class NodePublic(BaseModel):
    node_id: str
    total_gpus: int
    total_cpus: float
    gpu_model: str | None
    labels: dict[str, str]
    alive: bool

    @classmethod
    def of(cls, n: Node) -> NodePublic:
        return cls(
            node_id=n.node_id,
            total_gpus=n.total_gpus,
            total_cpus=n.total_cpus,
            gpu_model=n.gpu_model,
            labels=dict(n.labels),
            alive=n.alive,
        )


class ClusterPublic(BaseModel):
    nodes: list[NodePublic]
    total_gpus: int
    total_cpus: float
    sandbox: str = Field("none", description="How trial processes are isolated: bwrap or none.")
    warnings: list[str] = Field(default_factory=list, description="What an admin must know.")


class TrialUpdate(_In):
    priority: str = Field(description="low, normal, high or urgent (admins)")


class QueuePublic(BaseModel):
    data: list[TrialPublic]
    count: int


class UsageRowPublic(BaseModel):
    day: str
    tenant: str
    user: str
    project: str
    slot_hours: float


class TenantSharePublic(BaseModel):
    tenant: str
    guaranteed_slots: int
    slot_hours: float
    average_slots: float
    share_of_guarantee: float | None


class UsagePublic(BaseModel):
    since: float
    until: float
    data: list[UsageRowPublic]
    tenants: list[TenantSharePublic]
