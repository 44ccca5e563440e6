"""Issue 27 (ADR 0036): the reclaim budget, victims by the time they have left, borrowers by
attained service, a reservation for every owed tenant's head gang."""

from __future__ import annotations

from dataclasses import replace

from trainhub.core.scheduling import (
    FairShareConfig,
    FairSharePolicy,
    Preempt,
    Start,
    TenantShare,
)

from .helpers import by_id, check_contract, node, preempted, queued, running, snapshot

GUARANTEES = {"a": TenantShare(guaranteed_slots=8), "b": TenantShare(guaranteed_slots=8)}


def borrowed(started_at: float = 0.0) -> list:
    # b holds all 16 GPUs of two nodes: 8 guaranteed + 8 borrowed
    return [
        running(10 + i, "b", ["n1" if i < 8 else "n2"], started_at=started_at + i)
        for i in range(16)
    ]


def claim(policy: FairSharePolicy, now: float, run: list | None = None) -> set[int]:
    snap = snapshot(
        nodes=[node("n1", 8, free=0), node("n2", 8, free=0)],
        run=borrowed() if run is None else run,
        queue=[queued(i, "a", at=now + i) for i in range(1, 9)],
        now=now,
        tenants=GUARANTEES,
    )
    decisions = list(policy.decide(snap))
    check_contract(snap, decisions)
    return preempted(decisions)


def test_without_a_bound_a_returning_tenant_reclaims_its_whole_guarantee_at_once() -> None:
    policy = FairSharePolicy(FairShareConfig(reclaim_rate_share_per_h=None))
    assert len(claim(policy, 1000.0)) == 8


def test_the_reclaim_budget_bounds_the_preemptions_per_hour() -> None:
    # a's own budget: its guarantee of 8 slots, 50% of them per hour = 4 per hour; the budget
    # holds at most 2 (25%)
    config = FairShareConfig(
        reclaim_rate_share_per_h=0.5, reclaim_burst_share=0.25, reclaim_budget_per_tenant=True
    )
    policy = FairSharePolicy(config)
    # the budget's 2 slots: two 1-GPU claims, then the rest waits for it to refill
    assert len(claim(policy, 1000.0)) == 2
    # nothing refilled a second later: the same claims are refused
    assert claim(policy, 1001.0) == set()
    # half an hour refills 2 slots
    assert len(claim(policy, 1000.0 + 1800.0)) == 2
    # and a decision that could not reclaim asks to be woken when the budget is full again
    snap = snapshot(
        nodes=[node("n1", 8, free=0), node("n2", 8, free=0)],
        run=borrowed(),
        queue=[queued(1, "a", at=3000.0)],
        now=3000.0,
        tenants=GUARANTEES,
    )
    out = policy.decide(snap)
    assert out.wake_at is not None
    assert 3000.0 < out.wake_at <= 3000.0 + 1800.0


def test_victims_expected_to_end_soon_are_taken_last() -> None:
    config = FairShareConfig(reclaim_rate_share_per_h=None, victim_fewest_preemptions=False)
    run = borrowed()
    # the trials with the least work at risk (started last) end within the next 10 minutes
    ending = {r.trial_id for r in run[-4:]}
    run = [replace(r, expected_duration_s=1500.0) if r.trial_id in ending else r for r in run]
    snap = snapshot(
        nodes=[node("n1", 8, free=0), node("n2", 8, free=0)],
        run=run,
        queue=[queued(1, "a", gpus=2, at=1000.0)],
        now=1000.0,
        tenants=GUARANTEES,
    )
    victims = preempted(list(FairSharePolicy(config).decide(snap)))
    assert len(victims) == 2
    assert not victims & ending
    # with the rule off, the least work at risk goes first: trials started last
    off = replace(config, victim_time_left_s=0.0)
    assert preempted(list(FairSharePolicy(off).decide(snap))) <= ending


def test_borrowed_capacity_goes_to_the_trial_with_the_least_attained_service() -> None:
    # both tenants borrow (no guarantees); c used less, but its next trial ran for hours
    # before a preemption; d's is new: d's goes first with borrow_by_service (off by
    # default: the tuning split did not choose it, ADR 0036)
    tenants = {"c": TenantShare(), "d": TenantShare()}
    kw = {
        "nodes": [node("n", 1)],
        "queue": [queued(1, "c", attained=50_000.0), queued(2, "d")],
        "tenants": tenants,
        "usage": {"c": 0.0, "d": 1e6},
    }
    by_service = FairSharePolicy(FairShareConfig(borrow_by_service=True))
    out = by_id(list(by_service.decide(snapshot(**kw))))  # type: ignore[arg-type]
    assert isinstance(out[2], Start)
    plain = FairSharePolicy(FairShareConfig(borrow_by_service=False))
    out = by_id(list(plain.decide(snapshot(**kw))))  # type: ignore[arg-type]
    assert isinstance(out[1], Start)


def test_every_owed_tenant_s_head_gang_holds_a_reservation() -> None:
    """The starvation of issue 27 in one decision: two owed tenants' 4-GPU gangs (one node
    each) and a borrower's 1-GPU trials. With one reservation per pass the second gang's
    node is backfilled; with one per owed tenant only the node neither gang needs is."""
    tenants = {"a": TenantShare(4), "b": TenantShare(4), "c": TenantShare(4)}
    nodes = [node("n1", 4, free=2), node("n2", 4, free=2), node("n3", 4, free=1)]
    run = [
        running(10, "c", ["n1", "n1"]),
        running(11, "c", ["n2", "n2"]),
        running(12, "c", ["n3"] * 3),
    ]
    queue = [
        queued(1, "a", gpus=4, single_node=True, at=10.0),
        queued(2, "b", gpus=4, single_node=True, at=11.0),
        *(queued(20 + i, "c", at=20.0 + i) for i in range(6)),
    ]
    kw = {"nodes": nodes, "run": run, "queue": queue, "tenants": tenants, "now": 100.0}

    def backfilled(reserve_every_owed: bool) -> list[str]:
        config = FairShareConfig(preemption=False, reserve_every_owed=reserve_every_owed)
        snap = snapshot(**kw)  # type: ignore[arg-type]
        out = list(FairSharePolicy(config).decide(snap))
        check_contract(snap, out)
        return sorted(n for d in out if isinstance(d, Start) for n in d.placement)

    # before: c's trials take the free GPUs of the node the second gang needs (and n3's)
    assert backfilled(False) == ["n2", "n2", "n3"]
    # after: only n3's
    assert backfilled(True) == ["n3"]


def test_a_claim_keeps_the_free_gpus_its_placement_counts_on() -> None:
    # ADR 0042: a's 4-GPU gang reclaims two of b's borrowed GPUs and counts on the two free
    # ones beside them. Before, c's 1-GPU trials later in the same pass took those two free
    # GPUs: when b's victims left, the gang still did not fit and preempted again (Philly
    # 16x8 at 1.5x: share 0.844, 0.28 preemptions per job)
    tenants = {
        "a": TenantShare(guaranteed_slots=8),
        "b": TenantShare(guaranteed_slots=0),
        "c": TenantShare(guaranteed_slots=0),
    }
    snap = snapshot(
        nodes=[node("n1", 8, free=2)],
        run=[running(10 + i, "b", ["n1"], started_at=float(i)) for i in range(6)],
        queue=[queued(1, "a", gpus=4, at=900.0), queued(2, "c", at=950.0), queued(3, "c")],
        now=1000.0,
        tenants=tenants,
        usage={"c": 0.0, "b": 1e6},
    )
    decisions = list(FairSharePolicy(FairShareConfig(reclaim_rate_share_per_h=None)).decide(snap))
    check_contract(snap, decisions)
    assert len(preempted(decisions)) == 2
    found = by_id(decisions)
    assert not isinstance(found[1], Start)
    assert not any(isinstance(found[t], Start) for t in (2, 3))


def test_one_tenant_s_big_reclaim_does_not_spend_another_owed_tenant_s_budget() -> None:
    """ADR 0036, amendment: a and b are both owed their 8 GPUs; c borrows all 24. a's 8-GPU
    gang reclaims first and spends a budget (a full one lets it through whatever its size).
    With one budget for the cluster that leaves nothing for b, whose 1-GPU trial is refused
    until the budget has refilled; with a budget per tenant b's own is full and it reclaims."""
    tenants = {
        "a": TenantShare(guaranteed_slots=8),
        "b": TenantShare(guaranteed_slots=8),
        "c": TenantShare(guaranteed_slots=8),
    }
    snap = snapshot(
        nodes=[node(f"n{k}", 8, free=0) for k in (1, 2, 3)],
        run=[running(10 + i, "c", [f"n{1 + i // 8}"], started_at=float(i)) for i in range(24)],
        queue=[
            queued(1, "a", gpus=8, single_node=True, at=900.0),
            queued(2, "b", at=950.0),
        ],
        now=1000.0,
        tenants=tenants,
    )

    def victims_by_claimant(config: FairShareConfig) -> dict[str, int]:
        decisions = list(FairSharePolicy(config).decide(snap))
        check_contract(snap, decisions)
        found: dict[str, int] = {}
        for d in decisions:
            if isinstance(d, Preempt):
                claimant = "a" if "tenant a " in d.reason else "b"
                found[claimant] = found.get(claimant, 0) + 1
        return found

    # the defaults: a budget per tenant; both claims go through
    assert victims_by_claimant(FairShareConfig(reclaim_budget_per_tenant=True)) == {"a": 8, "b": 1}
    # one budget for the cluster (the default, as first shipped): a's gang spends it, b waits
    shared = FairShareConfig()
    assert victims_by_claimant(shared) == {"a": 8}


def test_a_one_slot_tenant_reclaims_at_the_floor_s_rate() -> None:
    """ADR 0036, third amendment: s is guaranteed 1 of 16 GPUs and b borrows the one s does
    not use. Each time s's 1-GPU trial waits again (its last one ended and b took the GPU), s
    reclaims from a budget of its own: 1 slot deep, refilling at 1.0 x 1 slot = 1 slot per
    hour without a floor, so one reclaim per hour; with a floor of 12 slots per hour, one
    every 5 minutes."""
    tenants = {"s": TenantShare(guaranteed_slots=1), "b": TenantShare(guaranteed_slots=15)}
    b_run = [
        running(10 + i, "b", ["n1" if i < 8 else "n2"], started_at=float(i)) for i in range(16)
    ]

    def reclaims(policy: FairSharePolicy, now: float) -> tuple[int, float | None]:
        snap = snapshot(
            nodes=[node("n1", 8, free=0), node("n2", 8, free=0)],
            run=b_run,
            queue=[queued(1, "s", at=now - 1.0)],
            now=now,
            tenants=tenants,
        )
        out = policy.decide(snap)
        decisions = list(out)
        check_contract(snap, decisions)
        return len(preempted(decisions)), out.wake_at

    def config(floor: float) -> FairShareConfig:
        return FairShareConfig(
            reclaim_rate_share_per_h=1.0,
            reclaim_burst_share=0.05,
            reclaim_budget_per_tenant=True,
            reclaim_floor_slots_per_h=floor,
        )

    floored = FairSharePolicy(config(12.0))
    assert reclaims(floored, 1000.0) == (1, None)  # a full budget: through at once
    # 4 minutes refill 0.8 slot: refused, and the decision asks to be woken at 5 minutes
    assert reclaims(floored, 1240.0) == (0, 1300.0)
    # 5 minutes after the first: the budget is full again and the next reclaim goes through
    assert reclaims(floored, 1300.0)[0] == 1
    # a whole hour: 12 reclaims, one per 5 minutes
    through = sum(reclaims(floored, 1300.0 + 300.0 * k)[0] for k in range(1, 13))
    assert through == 12

    # without the floor the same tenant gets one slot back per hour
    bare = FairSharePolicy(config(0.0))
    assert reclaims(bare, 1000.0)[0] == 1
    assert reclaims(bare, 1300.0) == (0, 1000.0 + 3600.0)
    assert reclaims(bare, 1000.0 + 3599.0)[0] == 0
    assert reclaims(bare, 1000.0 + 3600.0)[0] == 1
