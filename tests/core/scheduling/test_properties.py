"""Properties every policy keeps on random snapshots (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import event, given, settings
from hypothesis import strategies as st

from trainhub.core.scheduling import (
    FairShareConfig,
    FairSharePolicy,
    FifoPolicy,
    LeastAttainedServicePolicy,
    Pending,
    ShortestJobFirstPolicy,
    Snapshot,
    Start,
    TenantShare,
)
from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.reservation import reserve
from trainhub.core.scheduling.runningtable import RunningTable
from trainhub.core.spec import Priority

from .helpers import check_contract, node, queued, running

TENANTS = ("a", "b", "c")


@st.composite
def snapshots(draw: st.DrawFn, known: bool = False) -> Snapshot:
    num_nodes = draw(st.integers(1, 5))
    sizes = [draw(st.sampled_from([1, 2, 4, 8])) for _ in range(num_nodes)]
    nodes = [
        node(f"n{i}", g, temp=draw(st.one_of(st.none(), st.floats(30, 95))))
        for i, g in enumerate(sizes)
    ]
    free = {n.node_id: n.total_gpus for n in nodes}
    run = []
    for i in range(draw(st.integers(0, 8))):
        where = draw(st.sampled_from([n.node_id for n in nodes]))
        if free[where] == 0:
            continue
        gpus = draw(st.integers(1, free[where]))
        free[where] -= gpus
        run.append(
            running(
                100 + i,
                draw(st.sampled_from(TENANTS)),
                [where] * gpus,
                started_at=draw(st.floats(0, 5000)),
                priority=draw(st.sampled_from(list(Priority))),
                duration=draw(st.floats(1, 10000)) if known else None,
                attained=draw(st.floats(0, 50000)),
                preempting=draw(st.booleans()) and i % 3 == 0,
            )
        )
    nodes = [replace(n, free_gpus=free[n.node_id]) for n in nodes]
    queue = [
        queued(
            i,
            draw(st.sampled_from(TENANTS)),
            gpus=draw(st.sampled_from([1, 1, 2, 3, 4, 8, 16])),
            priority=draw(st.sampled_from(list(Priority))),
            at=draw(st.floats(0, 5000)),
            duration=draw(st.floats(1, 10000)) if known else None,
            attained=draw(st.sampled_from([0.0, 0.0, 5000.0, 50000.0])),
            single_node=draw(st.booleans()),
        )
        for i in range(draw(st.integers(0, 12)))
    ]
    guarantees = {t: TenantShare(draw(st.integers(0, 8))) for t in TENANTS}
    usage = {t: draw(st.floats(0, 1e6)) for t in TENANTS}
    return Snapshot(
        now=6000.0,
        nodes=tuple(nodes),
        queue=tuple(queue),
        running=tuple(run),
        tenants=guarantees,
        tenant_usage=usage,
    )


POLICIES = [
    FairSharePolicy(),
    FairSharePolicy(FairShareConfig(backfill=False)),
    FairSharePolicy(FairShareConfig(min_run_time_s=0.0, service_thresholds_slot_s=())),
    FifoPolicy(),
    ShortestJobFirstPolicy(),
    LeastAttainedServicePolicy(),
]


@settings(max_examples=150, deadline=None)
@given(snapshots(), st.sampled_from(POLICIES))
def test_every_policy_keeps_the_contract(snap: Snapshot, policy: object) -> None:
    decisions = list(policy.decide(snap))  # type: ignore[attr-defined]
    check_contract(snap, decisions)


@settings(max_examples=200, deadline=None)
@given(snapshots(known=True), st.booleans(), st.integers(2, 16), st.booleans())
def test_backfill_never_delays_the_head_reservation(
    snap: Snapshot, known: bool, head_gpus: int, single: bool
) -> None:
    """The first trial in order does not fit and gets a reservation; after the trials started
    behind it, its reservation must be no later (known durations) and its reserved nodes must
    still hold what it needs once the trials running before the pass are gone (unknown)."""
    head = queued(
        999,
        "a",
        gpus=head_gpus,
        priority=Priority.URGENT,
        at=0.0,
        duration=100.0,
        single_node=single,
    )
    others = [replace(t, tenant="a", priority=Priority.NORMAL) for t in snap.queue]
    if not known:
        others = [replace(t, expected_duration_s=None) for t in others]
        snap = replace(
            snap, running=tuple(replace(t, expected_duration_s=None) for t in snap.running)
        )
    snap = replace(snap, queue=(head, *others))
    # with known durations, backfill on them (the oracle's mode; off by default)
    policy = FairSharePolicy(FairShareConfig(preemption=False, estimates_for_backfill=known))
    decisions = list(policy.decide(snap))
    reason = next((d.reason for d in decisions if isinstance(d, Pending) and d.trial_id == 999), "")
    event("head reserved" if "next in line" in reason else "no reservation")
    if "next in line" not in reason:
        return  # the head started, or can never run: no reservation
    table = RunningTable(snap.running)
    before = reserve(head, NodePool(snap.nodes), table, snap.now)
    # the starts of this pass become running trials with their expected durations
    by_id = {t.trial_id: t for t in snap.queue}
    started = [
        running(
            d.trial_id,
            by_id[d.trial_id].tenant,
            d.placement,
            started_at=snap.now,
            duration=by_id[d.trial_id].expected_duration_s,
        )
        for d in decisions
        if isinstance(d, Start)
    ]
    used: dict[str, int] = {}
    for s in started:
        for n in s.placement:
            used[n] = used.get(n, 0) + 1
    nodes = tuple(replace(n, free_gpus=n.free_gpus - used.get(n.node_id, 0)) for n in snap.nodes)
    after = reserve(head, NodePool(nodes), table.updated(started), snap.now)
    if before.start_at is not None:
        assert after.start_at is not None
        assert after.start_at <= before.start_at + 1e-6
    else:
        # unknown start: the reserved nodes still hold what the head needs there
        need: dict[str, int] = {}
        for n in before.ranks:
            need[n] = need.get(n, 0) + head.request.gpus_per_worker
        total = {n.node_id: n.total_gpus for n in nodes}
        for n, gpus in need.items():
            assert total[n] - used.get(n, 0) >= gpus
