"""Nodes (inventory, health, series, cordon/drain) under /api/v1, and /metrics for Prometheus."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from trainhub.api.deps import CurrentPrincipal, ServicesDep
from trainhub.api.params import TrialId, errors
from trainhub.core.errors import Conflict
from trainhub.service.auth import require_admin
from trainhub.service.container import Services
from trainhub.service.monitoring import MonitoringService, NodeStatus, gather_cluster_metrics

router = APIRouter(tags=["nodes"])
metrics_router = APIRouter()
_MAX_TIME = 1e11


class GpuPublic(BaseModel):
    index: int
    uuid: str
    utilization_pct: float
    memory_used_gb: float
    memory_total_gb: float
    temperature_c: float
    power_w: float | None
    sm_clock_mhz: float | None
    ecc_uncorrected: int
    throttle_reasons: list[str]
    trial_ids: list[int]


class NodePublic(BaseModel):
    node_id: str
    hostname: str | None = None
    healthy: bool
    health_reasons: list[str]
    schedulable: bool
    cordoned: bool
    draining: bool
    control_reason: str
    last_seen: float | None
    cpu_model: str | None = None
    num_cores: int | None = None
    memory_gb: float | None = Field(None, description="Host memory (GiB), as its agent reads it")
    reservable_memory_gb: float | None = Field(
        None,
        description="What trials may reserve of it (GiB): Ray's `memory` resource, the memory "
        "free when Ray started on the node less its object store; `trainhub cluster` shows it",
    )
    nics: list[dict[str, str]] = Field(default_factory=list)
    gpu_inventory: list[dict[str, str]] = Field(default_factory=list)
    cpu_pct: float | None = None
    memory_used_gb: float | None = None
    gpus: list[GpuPublic] = Field(default_factory=list)
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="The node's labels: its agent's, with `trainhub nodes label`'s over them "
        "(rack, block: the topology levels a spec's resources.topology names)",
    )

    @classmethod
    def of(cls, status: NodeStatus) -> NodePublic:
        inv, latest = status.inventory, status.latest
        return cls(
            node_id=status.node_id,
            hostname=inv.hostname if inv else None,
            healthy=status.health.healthy,
            health_reasons=list(status.health.reasons),
            schedulable=status.schedulable,
            cordoned=status.control.cordoned,
            draining=status.control.draining,
            control_reason=status.control.reason,
            last_seen=status.last_seen,
            cpu_model=inv.cpu_model if inv else None,
            num_cores=inv.num_cores if inv else None,
            memory_gb=inv.memory_gb if inv else None,
            nics=[dict(n) for n in inv.nics] if inv else [],
            gpu_inventory=[dict(g) for g in inv.gpus] if inv else [],
            labels=dict(status.labels),
            cpu_pct=latest.cpu_pct if latest else None,
            memory_used_gb=latest.memory_used_gb if latest else None,
            gpus=[
                GpuPublic(
                    index=g.index,
                    uuid=g.uuid,
                    utilization_pct=g.utilization_pct,
                    memory_used_gb=g.memory_used_gb,
                    memory_total_gb=g.memory_total_gb,
                    temperature_c=g.temperature_c,
                    power_w=g.power_w,
                    sm_clock_mhz=g.sm_clock_mhz,
                    ecc_uncorrected=g.ecc_uncorrected,
                    throttle_reasons=list(g.throttle_reasons),
                    trial_ids=list(g.trial_ids),
                )
                for g in (latest.gpus if latest else ())
            ],
        )


class NodesPublic(BaseModel):
    data: list[NodePublic]
    count: int


class HealthEventPublic(BaseModel):
    at: float
    healthy: bool
    reason: str


class NodeSeriesPublic(BaseModel):
    node_id: str
    metric: str
    points: list[tuple[float, float]]


class TrialNodeUsagePublic(BaseModel):
    node_id: str
    hostname: str | None
    cpu_pct: float | None = Field(description="CPU % of the trial's processes on the node")
    memory_gb: float | None = Field(description="Resident memory of those processes")
    gpus: list[GpuPublic]


class TrialUsagePublic(BaseModel):
    trial_id: int
    data: list[TrialNodeUsagePublic]


class NodeControlBody(BaseModel):
    reason: str = Field("", max_length=500, description="Why, shown in `trainhub nodes`")


def _monitoring(services: Services) -> MonitoringService:
    if services.monitoring is None:
        raise Conflict("monitoring is off on this control plane", hint="start it with monitoring")
    return services.monitoring


def _known(services: Services) -> list[str]:
    return [n.node_id for n in services.cluster_nodes()]


@router.get("/nodes", response_model=NodesPublic, responses=errors(409))
def list_nodes(services: ServicesDep, principal: CurrentPrincipal) -> NodesPublic:
    """Every node: hardware, health, admin controls and the latest sample of its agent. The
    trials on each GPU are shown to admins, and to others only where the trial is theirs."""
    monitoring = _monitoring(services)
    known = services.cluster_nodes()
    nodes = [NodePublic.of(n) for n in monitoring.nodes(n.node_id for n in known)]
    reservable = {n.node_id: n.total_memory_gb for n in known if math.isfinite(n.total_memory_gb)}
    for node in nodes:
        node.reservable_memory_gb = reservable.get(node.node_id)
    if not principal.is_admin:
        tenants = gather_cluster_metrics(services.uow, services.clock()).trial_tenants
        visible = {t for t, tenant in tenants.items() if tenant in principal.roles}
        for node in nodes:
            for gpu in node.gpus:
                gpu.trial_ids = [t for t in gpu.trial_ids if t in visible]
    return NodesPublic(data=nodes, count=len(nodes))


@router.get("/trials/{trial_id}/gpus", response_model=TrialUsagePublic, responses=errors(404, 409))
def trial_gpus(
    services: ServicesDep, principal: CurrentPrincipal, trial_id: TrialId
) -> TrialUsagePublic:
    """The GPUs a trial's processes use, with their live utilisation, and its processes' CPU
    and memory on each node (from the node agents' latest samples)."""
    services.experiments.get_trial(principal, trial_id)  # 404 unless the caller may see it
    data = []
    for status, gpus in _monitoring(services).trial_usage(trial_id):
        node = NodePublic.of(status)
        used = status.latest.trials.get(trial_id) if status.latest else None
        data.append(
            TrialNodeUsagePublic(
                node_id=status.node_id,
                hostname=node.hostname,
                cpu_pct=used[0] if used else None,
                memory_gb=used[1] if used else None,
                gpus=[g for g in node.gpus if g.uuid in {x.uuid for x in gpus}],
            )
        )
    return TrialUsagePublic(trial_id=trial_id, data=data)


@router.get(
    "/nodes/{node}/health", response_model=list[HealthEventPublic], responses=errors(404, 409)
)
def node_health(
    services: ServicesDep,
    principal: CurrentPrincipal,
    node: str,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[HealthEventPublic]:
    """The node's health changes, newest first."""
    monitoring = _monitoring(services)
    node_id = monitoring.resolve(node, _known(services))
    return [
        HealthEventPublic(at=at, healthy=ok, reason=why)
        for at, ok, why in monitoring.health_history(node_id, limit)
    ]


@router.get("/nodes/{node}/series", response_model=NodeSeriesPublic, responses=errors(404, 409))
def node_series(
    services: ServicesDep,
    principal: CurrentPrincipal,
    node: str,
    metric: Annotated[str, Query(max_length=64, description="e.g. cpu_pct, gpu0.temperature_c")],
    since: Annotated[float | None, Query(ge=0, le=_MAX_TIME, allow_inf_nan=False)] = None,
    until: Annotated[float | None, Query(ge=0, le=_MAX_TIME, allow_inf_nan=False)] = None,
) -> NodeSeriesPublic:
    """One metric of one node; raw samples for recent ranges, bucket means for older ones."""
    monitoring = _monitoring(services)
    node_id = monitoring.resolve(node, _known(services))
    now = services.clock()
    points = monitoring.series(node_id, metric, since or now - 3600, until or now)
    return NodeSeriesPublic(node_id=node_id, metric=metric, points=points)


class NodeLabelsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: dict[
        Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,63}$")],
        Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{0,63}$")],
    ] = Field(
        max_length=32,
        description="KEY: VALUE to set (an empty value removes the label), e.g. {rack: r3}",
    )


def _admin_first(principal: CurrentPrincipal) -> None:
    """Refuse a non-admin before the body is read (its 403, not a 422 about a body it may
    not send at all)."""
    require_admin(principal)


@router.post(
    "/nodes/{node}/labels",
    response_model=NodePublic,
    responses=errors(403, 404),
    dependencies=[Depends(_admin_first)],
)
def label_node(
    services: ServicesDep, principal: CurrentPrincipal, node: str, body: NodeLabelsBody
) -> NodePublic:
    """Admins: set a node's labels, e.g. its topology levels ``rack`` and ``block`` (stored;
    they win over the agent's configured ones); an empty value removes a label."""
    require_admin(principal)
    monitoring = _monitoring(services)
    known = _known(services)
    node_id = monitoring.resolve(node, known)
    monitoring.set_labels(principal, node_id, body.labels)
    return next(NodePublic.of(n) for n in monitoring.nodes(known) if n.node_id == node_id)


@router.post("/nodes/{node}/{action}", response_model=NodePublic, responses=errors(403, 404, 409))
def control_node(
    services: ServicesDep,
    principal: CurrentPrincipal,
    node: str,
    action: Literal["cordon", "uncordon", "drain"],
    body: NodeControlBody | None = None,
) -> NodePublic:
    """Admins: cordon (no new trials), drain (cordon, and preempt its trials by checkpoint:
    they resume elsewhere) or uncordon (take new trials again)."""
    require_admin(principal)
    monitoring = _monitoring(services)
    known = _known(services)
    node_id = monitoring.resolve(node, known)
    monitoring.set_control(
        principal,
        node_id,
        cordoned=action != "uncordon",
        draining=action == "drain",
        reason=body.reason if body else "",
    )
    return next(NodePublic.of(n) for n in monitoring.nodes(known) if n.node_id == node_id)


@metrics_router.get("/metrics", include_in_schema=False)
def metrics(services: ServicesDep, principal: CurrentPrincipal) -> Response:
    """Prometheus exposition (admins: per-tenant and per-trial labels)."""
    from trainhub.api.prometheus import exposition

    require_admin(principal)
    body, content_type = exposition(services)
    return Response(body, media_type=content_type)
