"""Request and response bodies: XCreate / XUpdate / XPublic / XsPublic{data, count}."""

from __future__ import annotations

import base64
import dataclasses
import math
from typing import Annotated, Any, NotRequired

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, TypeAdapter
from typing_extensions import TypedDict

from trainhub.core import limits
from trainhub.core.resources import Node
from trainhub.core.states import ExperimentState, TrialState
from trainhub.service import records
from trainhub.service.experiments import ExperimentDetail, TrialDetail
from trainhub.service.metric_warnings import experiment_metric_warnings, trial_metric_warning
from trainhub.service.monitoring import NodeInventory
from trainhub.service.tracking import LogChunk, StorageQuota, TrialWrites


class _In(BaseModel):
    # NaN and infinities are refused in every input (JSON has no such numbers)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


_ShortText = Annotated[str, Field(max_length=256)]
_Name = Annotated[str, Field(min_length=1, max_length=64)]
MetricName = Annotated[str, Field(pattern=limits.METRIC_NAME_PATTERN)]
# a metric value is a JSON number: strings and booleans are refused, not coerced
MetricValue = Annotated[StrictFloat, Field(allow_inf_nan=False)]
_Slots = Annotated[int, Field(ge=0, le=1_000_000)]
_Bytes = Annotated[int, Field(ge=1, le=limits.INT64_MAX)]


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
    best_value: float | None = Field(
        None, description="Best value of the searcher's metric any trial reported."
    )

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
            best_value=e.best_value,
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
    warnings: list[str] = Field(
        default=[], description="What may be wrong, e.g. a searcher metric it does not report."
    )

    @classmethod
    def of(cls, t: records.Trial, spec: dict[str, Any] | None = None) -> TrialPublic:
        warning = trial_metric_warning(spec, t) if spec is not None else None
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
            warnings=[warning] if warning else [],
        )


class ExperimentDetailPublic(ExperimentPublic):
    spec: dict[str, Any]
    trials: list[TrialPublic]
    warnings: list[str] = Field(
        default=[], description="What may be wrong, e.g. a searcher metric no trial reports."
    )

    @classmethod
    def of_detail(cls, d: ExperimentDetail) -> ExperimentDetailPublic:
        base = ExperimentPublic.of(d.experiment).model_dump()
        spec = d.experiment.spec
        return cls(
            **base,
            spec=spec,
            trials=[TrialPublic.of(t, spec) for t in d.trials],
            warnings=experiment_metric_warnings(spec, d.trials),
        )


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


class LayerAlertPublic(BaseModel):
    """A layer-health alert raised from the trial's ``layers/*`` metrics (``ctx.watch``)."""

    kind: str = Field(
        description="nonfinite | exploding_gradients | vanishing_gradients | dead_layer"
    )
    layer: str = Field(description="The module name, e.g. 'features.3'.")
    step: int = Field(description="The training step it first fired at.")
    last_step: int = Field(description="The latest step it fired at.")
    value: float | None = Field(description="The statistic that fired, at ``step``.")
    message: str

    @classmethod
    def of(cls, a: records.LayerAlertRecord) -> LayerAlertPublic:
        return cls(
            kind=a.kind,
            layer=a.layer,
            step=a.first_step,
            last_step=a.last_step,
            value=a.value,
            message=a.message,
        )


class LayerAlertsPublic(BaseModel):
    data: list[LayerAlertPublic]
    count: int


class TrialWritesPublic(BaseModel):
    """What the trial wrote and the caps on it (issue 24; docs/security.md)."""

    metric_points: int = Field(description="Metric points stored.")
    metric_points_dropped: int = Field(description="Points dropped past the trial's total cap.")
    metric_requests_throttled: int = Field(
        description="Metric requests answered 429 (per-minute cap) since the server started; "
        "the runtime sent them again, so their points are not lost."
    )
    max_metric_points_per_minute: int
    max_metric_points_per_trial: int
    disk_bytes: int = Field(
        description="Bytes of the trial's checkpoint folder, home and scratch, as its nodes "
        "last measured them (counted with its checkpoints against its storage quotas)."
    )

    @classmethod
    def of(cls, w: TrialWrites) -> TrialWritesPublic:
        return cls(**dataclasses.asdict(w))


class TrialDetailPublic(TrialPublic):
    experiment_name: str
    attempts: list[AttemptPublic]
    checkpoints: list[CheckpointPublic]
    events: list[EventPublic]
    alerts: list[LayerAlertPublic] = []
    writes: TrialWritesPublic | None = None
    limits: dict[str, str] = Field(
        default_factory=dict,
        description="What contains each rank: cgroup limits, network, seccomp.",
    )

    @classmethod
    def of_detail(cls, d: TrialDetail, writes: TrialWrites | None = None) -> TrialDetailPublic:
        return cls(
            **TrialPublic.of(d.trial, d.experiment.spec).model_dump(),
            experiment_name=d.experiment.name,
            attempts=[AttemptPublic.of(a) for a in d.attempts],
            checkpoints=[CheckpointPublic.of(c) for c in d.checkpoints],
            events=[EventPublic(time=e.time, kind=e.kind, message=e.message) for e in d.events],
            alerts=[LayerAlertPublic.of(a) for a in d.alerts],
            writes=TrialWritesPublic.of(writes) if writes is not None else None,
            limits=d.limits,
        )


class MetricPointIn(TypedDict):
    """One point of a metrics batch (the wire shape of ``runtime.protocol.MetricPoint``).

    The metrics route is every runtime's hot path: a batch is a TypedDict, not a model, and is
    validated straight from the request's JSON bytes by :data:`METRICS_BATCH` (pydantic-core),
    about 4x less CPU than ``json.loads`` and model instances for 1,000 points, with the same
    rules. Lists and mappings are bounded by ``max_length`` (the body by 1 MiB before).
    """

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)  # type: ignore[misc]
    step: Annotated[int, Field(ge=0, le=limits.INT64_MAX)]
    values: Annotated[
        dict[MetricName, MetricValue],
        Field(
            max_length=limits.MAX_METRICS_PER_POINT,
            description="Metric name -> finite number. Names: 1-128 of letters, digits, '_', "
            f"'.', '-', '/'; at most {limits.MAX_METRICS_PER_POINT} per point and "
            f"{limits.MAX_METRIC_NAMES_PER_TRIAL} distinct per trial.",
        ),
    ]
    time: NotRequired[Annotated[float | None, Field(ge=0, le=1e11)]]


class ProgressIn(_In):
    current: float = Field(ge=-1e15, le=1e15)
    total: float | None = Field(None, ge=-1e15, le=1e15)
    unit: str = Field("steps", max_length=32)


class MetricsBatchIn(TypedDict):
    """A batch of metric points of one attempt (``attempt`` defaults to 1)."""

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)  # type: ignore[misc]
    attempt: NotRequired[
        Annotated[int, Field(ge=1, le=limits.INT64_MAX, description="An existing attempt.")]
    ]
    points: NotRequired[
        Annotated[list[MetricPointIn], Field(max_length=limits.MAX_POINTS_PER_REQUEST)]
    ]
    progress: NotRequired[ProgressIn | None]


METRICS_BATCH: TypeAdapter[MetricsBatchIn] = TypeAdapter(MetricsBatchIn)


class MetricPointPublic(BaseModel):
    step: int
    attempt: int
    values: dict[str, float]
    reported_at: float


class MetricsPublic(BaseModel):
    data: list[MetricPointPublic]
    count: int


class StartupBody(BaseModel):
    """Rank 0's startup marks of one attempt (trainhub.runtime.protocol.StartupReport)."""

    model_config = ConfigDict(extra="forbid")
    attempt: int = Field(ge=1, le=limits.INT64_MAX, description="the attempt number")
    marks: dict[Annotated[str, Field(max_length=32)], float] = Field(
        max_length=16, description="mark name -> epoch seconds (trainhub.core.startup.MARKS)"
    )
    warm: bool = Field(default=False, description="the rank came from the warm pool")


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


class StorageQuotasIn(_In):
    max_checkpoint_bytes: _Bytes | None = Field(
        None, description="Largest checkpoint file; default 16 GiB."
    )
    max_trial_storage_bytes: _Bytes | None = Field(
        None, description="Checkpoints kept by one trial; default 64 GiB."
    )
    max_storage_bytes: _Bytes | None = Field(
        None, description="Checkpoints kept by the whole tenant; default 1 TiB."
    )


class TenantCreate(StorageQuotasIn):
    name: _Name
    guaranteed_slots: _Slots = 0
    limit_slots: _Slots | None = None
    weight: float = Field(1.0, gt=0, le=1e6)


class TenantUpdate(StorageQuotasIn):
    guaranteed_slots: _Slots | None = None
    limit_slots: _Slots | None = None
    weight: float | None = Field(None, gt=0, le=1e6)
    clear_limit: bool = False
    clear_storage_quotas: bool = Field(False, description="Back to the server's defaults.")


class TenantPublic(BaseModel):
    name: str
    guaranteed_slots: int
    limit_slots: int | None
    weight: float
    max_checkpoint_bytes: int
    max_trial_storage_bytes: int
    max_storage_bytes: int

    @classmethod
    def of(cls, t: records.Tenant) -> TenantPublic:
        quota = StorageQuota.of(t)
        return cls(
            name=t.name,
            guaranteed_slots=t.guaranteed_slots,
            limit_slots=t.limit_slots,
            weight=t.weight,
            max_checkpoint_bytes=quota.max_checkpoint_bytes,
            max_trial_storage_bytes=quota.max_trial_storage_bytes,
            max_storage_bytes=quota.max_storage_bytes,
        )


class TenantsPublic(BaseModel):
    data: list[TenantPublic]
    count: int


class UserCreate(_In):
    username: _Name
    is_admin: bool = False


class MembershipSet(_In):
    tenant: _Name
    role: str = Field("member", max_length=16, description="admin, member or viewer")


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
    name: str = Field("", max_length=128)
    username: _Name | None = Field(None, description="Admins: issue for another user.")
    ttl_s: float | None = Field(
        None, gt=0, le=100 * 365 * 86400.0, description="At most 100 years."
    )


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
    hostname: str | None = Field(None, description="As the node's agent reports it, if it has")
    total_gpus: int
    total_cpus: float
    total_memory_gb: float | None = Field(
        None,
        description="Host memory trials may reserve (GiB): Ray's `memory` resource, the memory "
        "free when Ray started on the node less its object store; null where the node reports "
        "none. `trainhub nodes` shows it beside the host's total memory.",
    )
    host_memory_gb: float | None = Field(
        None, description="The host's memory (GiB) as its agent reads it, if it has"
    )
    gpu_model: str | None
    labels: dict[str, str]
    alive: bool

    @classmethod
    def of(cls, n: Node, agent: NodeInventory | None = None) -> NodePublic:
        return cls(
            node_id=n.node_id,
            hostname=agent.hostname if agent else n.hostname,
            host_memory_gb=agent.memory_gb if agent else None,
            total_gpus=n.total_gpus,
            total_cpus=n.total_cpus,
            total_memory_gb=n.total_memory_gb if math.isfinite(n.total_memory_gb) else None,
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
    priority: str = Field(max_length=16, description="low, normal, high or urgent (admins)")


class QueuePublic(BaseModel):
    data: list[TrialPublic]
    count: int
    # set when tenant guarantees add up to more than the cluster and are scaled down
    note: str | None = None


class UsageRowPublic(BaseModel):
    day: str
    tenant: str
    user: str
    project: str
    slot_hours: float
    inter_node_sent_bytes: int = Field(
        default=0, description="Bytes the ranks sent to their trial's other nodes (ADR 0045)."
    )
    inter_node_received_bytes: int = 0
    intra_node_bytes: int = Field(
        default=0, description="Bytes the ranks of a trial sent each other within a node."
    )


class TenantSharePublic(BaseModel):
    tenant: str
    guaranteed_slots: int
    slot_hours: float
    average_slots: float
    share_of_guarantee: float | None
    guarantee_kept: float | None = Field(
        default=None,
        description="GPU-time received over GPU-time entitled to (min(guarantee, demand) at "
        "each instant) in the period; null when entitled to nothing.",
    )


class TenantStoragePublic(BaseModel):
    tenant: str
    checkpoint_bytes: int = Field(description="Kept checkpoints of the tenant's trials.")
    max_storage_bytes: int
    max_trial_storage_bytes: int
    max_checkpoint_bytes: int


class UsagePublic(BaseModel):
    since: float
    until: float
    data: list[UsageRowPublic]
    tenants: list[TenantSharePublic]
    storage: list[TenantStoragePublic] = Field(default_factory=list)
