"""Topology-aware gangs (issue 30): racks and blocks as node labels, required and preferred
levels, best fit among domains, the pending reason naming the level, the submit check."""

from __future__ import annotations

import random
from dataclasses import replace

from trainhub.core.resources import Node, ResourceRequest, can_ever_fit
from trainhub.core.scheduling import FairShareConfig, FairSharePolicy, Pending, Start
from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.placement import NoFit, place
from trainhub.core.topology import TopologyNeed

from .helpers import check_contract, node, queued, snapshot

RACK = TopologyNeed("rack", required=True)
PREFER_RACK = TopologyNeed("rack", required=False)


def labelled(
    name: str, rack: str | None, block: str = "b0", gpus: int = 8, free: int | None = None
) -> Node:
    labels = {"block": block, **({"rack": rack} if rack else {})}
    return replace(node(name, gpus, free), labels=labels)


def gang(gpus: int, topology: TopologyNeed | None = RACK) -> ResourceRequest:
    return ResourceRequest(
        num_workers=gpus, gpus_per_worker=1, cpus_per_worker=0.0, topology=topology
    )


def rack_of(nodes: list[Node], placement: tuple[str, ...]) -> set[str]:
    labels = {n.node_id: n.labels for n in nodes}
    return {labels[p].get("rack", "unknown") for p in placement}


def test_a_gang_that_requires_a_rack_never_straddles_two() -> None:
    rng = random.Random(7)
    for _ in range(200):
        nodes = [
            labelled(f"r{r}-n{n}", f"r{r}", free=rng.randint(0, 8))
            for r in range(3)
            for n in range(3)
        ]
        size = rng.choice([4, 8, 12, 16, 20])
        ranks = place(gang(size), nodes)
        if isinstance(ranks, NoFit):
            # no rack had the room: then truly none did
            per_rack = {
                f"r{r}": sum(n.free_gpus for n in nodes if n.labels["rack"] == f"r{r}")
                for r in range(3)
            }
            assert max(per_rack.values()) < size or "rack" in ranks.reason
            continue
        assert len(ranks) == size
        assert len(rack_of(nodes, ranks)) == 1


def test_the_tightest_rack_that_fits_is_chosen() -> None:
    nodes = [
        labelled("a1", "ra", free=8), labelled("a2", "ra", free=8),  # 16 free
        labelled("b1", "rb", free=8), labelled("b2", "rb", free=4),  # 12 free: tightest
        labelled("c1", "rc", free=4),  # 4 free: too small
    ]  # fmt: skip
    ranks = place(gang(10), nodes)
    assert isinstance(ranks, tuple)
    assert rack_of(nodes, ranks) == {"rb"}


def test_unlabelled_nodes_serve_only_gangs_without_a_required_level() -> None:
    nodes = [labelled("x1", None), labelled("x2", None), labelled("r1", "r1", free=2)]
    assert isinstance(place(gang(8), nodes), NoFit)
    assert isinstance(place(gang(8, PREFER_RACK), nodes), tuple)  # falls back to anywhere
    assert isinstance(place(gang(8, None), nodes), tuple)


def test_a_preferred_rack_is_taken_when_one_fits_and_waived_when_none_does() -> None:
    nodes = [labelled("a1", "ra", free=6), labelled("b1", "rb", free=6)]
    assert rack_of(nodes, place(gang(6, PREFER_RACK), nodes)) in ({"ra"}, {"rb"})  # type: ignore[arg-type]
    spread = place(gang(10, PREFER_RACK), nodes)
    assert isinstance(spread, tuple)
    assert rack_of(nodes, spread) == {"ra", "rb"}


def test_the_pending_reason_names_the_level_short() -> None:
    nodes = [
        labelled(f"r{r}-n{n}", f"r{r}", free=6 if r == 0 else 2) for r in range(2) for n in range(2)
    ]
    snap = snapshot(nodes=nodes, queue=[replace(queued(1, gpus=16), request=gang(16))])
    decisions = list(FairSharePolicy(FairShareConfig(preemption=False)).decide(snap))
    check_contract(snap, decisions)
    (decision,) = decisions
    assert isinstance(decision, Pending)
    assert "needs 16 GPUs in one rack; the best rack (r0) has 12 free" in decision.reason


def test_the_fair_policy_admits_a_gang_only_where_its_rack_holds_it() -> None:
    nodes = [
        labelled("a1", "ra", free=4),
        labelled("a2", "ra", free=4),
        labelled("b1", "rb", free=8),
    ]
    snap = snapshot(nodes=nodes, queue=[replace(queued(1, gpus=12), request=gang(12))])
    decisions = list(FairSharePolicy(FairShareConfig(preemption=False)).decide(snap))
    check_contract(snap, decisions)
    assert isinstance(decisions[0], Pending)  # 16 free in all, no rack has 12
    fits = snapshot(nodes=nodes, queue=[replace(queued(1, gpus=8), request=gang(8))])
    (start,) = FairSharePolicy(FairShareConfig(preemption=False)).decide(fits)
    assert isinstance(start, Start)
    assert rack_of(nodes, start.placement) in ({"ra"}, {"rb"})


def test_submit_refuses_a_level_no_node_carries_and_a_gang_no_rack_could_hold() -> None:
    plain = [node("n1"), node("n2")]
    why = can_ever_fit(gang(4, PREFER_RACK), plain)
    assert why is not None
    assert why.field == "resources.topology.preferred"
    assert "no node carries the level rack" in why.message
    racks = [labelled("a1", "ra"), labelled("a2", "ra"), labelled("b1", "rb")]
    why = can_ever_fit(gang(24), racks)
    assert why is not None
    assert why.field == "resources.topology.required"
    assert "largest rack (ra) holds at most 16" in why.message
    assert can_ever_fit(gang(16), racks) is None
    assert can_ever_fit(gang(24, PREFER_RACK), racks) is None


def test_the_empty_cluster_check_knows_the_domains() -> None:
    pool = NodePool([labelled("a1", "ra", free=0), labelled("b1", "rb", free=0)])
    from trainhub.core.scheduling.queue import shape_of

    assert pool.fits_empty(gang(8), shape_of(gang(8)))
    assert not pool.fits_empty(gang(12), shape_of(gang(12)))
    assert pool.fits_empty(gang(12, None), shape_of(gang(12, None)))


def test_the_free_gpus_per_rack_stay_in_step_as_a_pass_takes_and_frees() -> None:
    rng = random.Random(3)
    nodes = [
        labelled(f"r{r}-n{n}", f"r{r}", free=rng.randint(0, 8)) for r in range(4) for n in range(4)
    ]
    pool = NodePool(nodes)
    pool.domains("rack")
    for _ in range(300):
        request = gang(rng.choice([1, 2, 4, 8, 12]), rng.choice([RACK, PREFER_RACK, None]))
        ranks = pool.place(request)
        if ranks is not None and rng.random() < 0.7:
            pool.take(request, ranks)
        else:
            node_id = rng.choice(nodes).node_id
            pool.adjust(node_id, min(2, 8 - pool.free_gpus[node_id]))
        if rng.random() < 0.1:
            pool = pool.copy({rng.choice(nodes).node_id: rng.randint(0, 4)})
        expected = {
            name: sum(pool.usable(i) for i in members)
            for name, members in pool.domains("rack").items()
        }
        assert pool._domain_index("rack").free == expected
