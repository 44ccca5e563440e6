"""Issue 27: an owed tenant's multi-GPU gang is not starved by borrowers' 1-GPU backfill.

Two tenants below their guarantees each wait for a 4-GPU gang on one node while a borrower
keeps a stream of 1-GPU jobs queued. Preemption is off, so only reservations protect the
gangs. With one reservation per pass (before ADR 0036) the second gang has none: every GPU
that frees outside the first gang's node goes to a 1-GPU job, and the second gang waits for
the first to start and then for a node of its own to drain. With a reservation for every
owed tenant's head gang both drain a node at once.
"""

from __future__ import annotations

from dataclasses import replace

from trainhub.core.scheduling import FairShareConfig, FairSharePolicy, TenantShare
from trainhub.sim.cluster import ClusterSpec
from trainhub.sim.engine import SimConfig, Simulator
from trainhub.sim.trace import TraceJob

TENANTS = {"a": TenantShare(4), "b": TenantShare(4), "c": TenantShare(8)}
CLUSTER = ClusterSpec.uniform(4, 4)


def jobs() -> list[TraceJob]:
    # c borrows the whole cluster: 16 jobs, 4 per node (best fit fills node after node),
    # ending one by one between 600 s and 1,155 s, in turn on each node: node k drains at
    # 1,044 s + 37 s * k
    out = [TraceJob(i, 0.0, 600.0 + 37.0 * (4 * (i % 4) + i // 4), 1, "c") for i in range(16)]
    # and keeps 1-GPU jobs of 30 minutes queued: one every 20 s for 3 hours
    out += [TraceJob(100 + i, 1.0 + 20.0 * i, 1800.0, 1, "c") for i in range(540)]
    # a and b, both owed their guarantee, each want one 4-GPU gang on a node
    out.append(TraceJob(1000, 10.0, 3000.0, 4, "a", single_node=True))
    out.append(TraceJob(1001, 11.0, 3000.0, 4, "b", single_node=True))
    return out


def gang_starts(reserve_every_owed: bool) -> dict[str, float]:
    config = replace(FairShareConfig(), preemption=False, reserve_every_owed=reserve_every_owed)
    sim = SimConfig(checkpoint_interval_s=0.0)
    result = Simulator(jobs(), CLUSTER, FairSharePolicy(config), TENANTS, sim).run()
    starts = {r.tenant: r.first_start_s for r in result.records if r.job_id >= 1000}
    assert all(at is not None for at in starts.values())
    return {t: float(at) for t, at in starts.items() if at is not None}


def test_one_reservation_per_pass_starves_the_second_owed_gang() -> None:
    """The defect as measured: the second gang waits for the first to start, then for a
    node to drain while 1-GPU jobs keep taking the GPUs that free elsewhere."""
    starts = gang_starts(reserve_every_owed=False)
    first, second = sorted(starts.values())
    assert first == 1044.0  # the first node to drain
    # the other nodes were refilled by 1-GPU jobs of 30 minutes while they had no
    # reservation: the second gang waits for one of those to drain (measured: 2,733 s)
    assert second >= first + 1200.0


def test_every_owed_gang_holds_a_reservation() -> None:
    """The fix: both gangs reserve a node at once and start when c's first jobs end."""
    starts = gang_starts(reserve_every_owed=True)
    # node 0 drains at 1,044 s, node 1 at 1,081 s: each gang holds one of them
    assert sorted(starts.values()) == [1044.0, 1081.0]
