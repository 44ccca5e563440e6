"""Plain-value builders for policy tests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from trainhub.core.entitlement import Standing
from trainhub.core.resources import Node, ResourceRequest
from trainhub.core.scheduling import (
    Decision,
    Pending,
    Preempt,
    QueuedTrial,
    RunningTrial,
    Snapshot,
    Start,
    TenantShare,
)
from trainhub.core.spec import Placement, Priority


def node(
    name: str,
    gpus: int = 8,
    free: int | None = None,
    temp: float | None = None,
    model: str | None = None,
    cpus: float = 64.0,
) -> Node:
    return Node(
        node_id=name,
        total_gpus=gpus,
        total_cpus=cpus,
        free_gpus=gpus if free is None else free,
        free_cpus=cpus,
        gpu_model=model,
        gpu_temperature_c=temp,
    )


def request(
    gpus: int = 1,
    per_worker: int = 1,
    placement: Placement = Placement.PACK,
    single_node: bool = False,
    labels: dict[str, str] | None = None,
) -> ResourceRequest:
    return ResourceRequest(
        num_workers=gpus // per_worker,
        gpus_per_worker=per_worker,
        cpus_per_worker=0.0,
        placement=placement,
        single_node=single_node,
        node_labels=labels or {},
    )


def queued(
    trial_id: int,
    tenant: str = "a",
    gpus: int = 1,
    priority: Priority = Priority.NORMAL,
    at: float | None = None,
    duration: float | None = None,
    attained: float = 0.0,
    **kw: object,
) -> QueuedTrial:
    when = float(trial_id) if at is None else at
    return QueuedTrial(
        trial_id=trial_id,
        tenant=tenant,
        request=request(gpus, **kw),  # type: ignore[arg-type]
        priority=priority,
        queued_at=when,
        submitted_at=when,
        expected_duration_s=duration,
        attained_service=attained,
    )


def running(
    trial_id: int,
    tenant: str,
    placement: Sequence[str],
    started_at: float = 0.0,
    priority: Priority = Priority.NORMAL,
    duration: float | None = None,
    attained: float = 0.0,
    num_preemptions: int = 0,
    preempting: bool = False,
) -> RunningTrial:
    return RunningTrial(
        trial_id=trial_id,
        tenant=tenant,
        request=request(len(placement)),
        placement=tuple(placement),
        priority=priority,
        started_at=started_at,
        expected_duration_s=duration,
        attained_service=attained,
        num_preemptions=num_preemptions,
        preempting=preempting,
    )


def snapshot(
    nodes: Iterable[Node],
    queue: Iterable[QueuedTrial],
    run: Iterable[RunningTrial] = (),
    now: float = 0.0,
    tenants: dict[str, TenantShare] | None = None,
    usage: dict[str, float] | None = None,
    standing: dict[str, Standing] | None = None,
) -> Snapshot:
    return Snapshot(
        now=now,
        nodes=tuple(nodes),
        queue=tuple(queue),
        running=tuple(run),
        tenants=tenants or {},
        tenant_usage=usage or {},
        tenant_standing=standing or {},
    )


def by_id(decisions: Iterable[Decision]) -> dict[int, Start | Pending]:
    return {d.trial_id: d for d in decisions if not isinstance(d, Preempt)}


def preempted(decisions: Iterable[Decision]) -> set[int]:
    return {d.trial_id for d in decisions if isinstance(d, Preempt)}


def check_contract(snap: Snapshot, decisions: Sequence[Decision]) -> None:
    """Every queued trial exactly one Start/Pending with a reason; gangs whole; no overcommit;
    Preempt only of running trials not already being preempted."""
    queued_ids = [t.trial_id for t in snap.queue]
    answered = [d.trial_id for d in decisions if isinstance(d, Start | Pending)]
    assert sorted(answered) == sorted(queued_ids)
    requests = {t.trial_id: t.request for t in snap.queue}
    free = {n.node_id: n.free_gpus for n in snap.nodes if n.alive}
    for d in decisions:
        if isinstance(d, Pending):
            assert d.reason.strip()
        elif isinstance(d, Start):
            req = requests[d.trial_id]
            assert len(d.placement) == req.num_workers
            if req.single_node:
                assert len(set(d.placement)) == 1
            for n in d.placement:
                free[n] -= req.gpus_per_worker
    assert all(v >= 0 for v in free.values()), free
    runnable = {t.trial_id for t in snap.running if not t.preempting}
    assert preempted(decisions) <= runnable
