"""The domains of a topology level and their usable GPUs (core/scheduling/domains.py), as the
node table carries them from pass to pass and a pool keeps them in step within one."""

from __future__ import annotations

import random
from dataclasses import replace

from trainhub.core.resources import Node, ResourceRequest
from trainhub.core.scheduling.domains import DomainIndex
from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.nodetable import NodeTable
from trainhub.core.topology import TopologyNeed

from .helpers import node

RACK = TopologyNeed("rack", required=True)


def racked(name: str, rack: str | None, free: int, temp: float | None = None) -> Node:
    labels = {"block": "b0", **({"rack": rack} if rack else {})}
    return replace(node(name, 8, free, temp=temp), labels=labels)


def cluster(rng: random.Random, racks: int = 4, per_rack: int = 3) -> list[Node]:
    nodes = [
        racked(f"r{r}-n{n}", f"r{r}", rng.randint(0, 8), rng.choice([None, 40.0, 60.0, 90.0]))
        for r in range(racks)
        for n in range(per_rack)
    ]
    return [*nodes, racked("loose", None, 8)]  # a node without a rack: domain "unknown"


def sums(nodes: list[Node], level: str) -> dict[str, int]:
    """What an index must hold: each domain's free GPUs, summed afresh."""
    out: dict[str, int] = {}
    for n in nodes:
        name = n.labels.get(level, "unknown")
        out[name] = out.get(name, 0) + max(0, n.free_gpus)
    return out


def test_an_index_groups_nodes_and_ranks_the_fitting_domains_tightest_first() -> None:
    nodes = [racked("a", "r1", 6), racked("b", "r1", 2), racked("c", "r2", 3), racked("d", None, 8)]
    free = {n.node_id: n.free_gpus for n in nodes}
    index = DomainIndex.build("rack", {n.node_id: n for n in nodes}, free.__getitem__)
    assert index.members == {"r1": ["a", "b"], "r2": ["c"], "unknown": ["d"]}
    assert index.free == {"r1": 8, "r2": 3, "unknown": 8}
    # the unlabelled domain never fits; ties and order by (free, name)
    assert index.fitting(3) == [(3, "r2"), (8, "r1")]
    assert index.fitting(4) == [(8, "r1")]
    copy = index.copy()
    copy.moved("c", 5)
    assert copy.free["r2"] == 8
    assert index.free["r2"] == 3  # a copy moves apart
    assert copy.fitting(8) == [(8, "r1"), (8, "r2")]
    assert copy.members is index.members  # the grouping is shared


def test_the_table_keeps_an_index_in_step_as_free_gpus_change() -> None:
    rng = random.Random(11)
    nodes = cluster(rng)
    table = NodeTable(nodes)
    table.domain_index("rack")
    for _ in range(200):
        changed = {
            n.node_id: replace(n, free_gpus=rng.randint(-1, 8)) for n in rng.sample(nodes, 3)
        }
        nodes = [changed.get(n.node_id, n) for n in nodes]
        old, held = table, dict(table.domains["rack"].free)
        table = table.updated(changed)
        assert table.domains["rack"].free == sums(nodes, "rack")
        assert old.domains["rack"].free == held  # the table it came from did not move
        # a level asked for later starts from the table's own free GPUs
        assert "block" not in table.domains
    assert table.domain_index("block").free == sums(nodes, "block")


def test_a_pool_asked_for_a_level_after_its_own_changes_counts_them() -> None:
    rng = random.Random(5)
    nodes = cluster(rng)
    table = NodeTable(nodes)
    pool = NodePool(table)
    pool.adjust("r0-n0", -min(2, pool.free_gpus["r0-n0"]))
    pool.restrict({"r1-n1": 0})
    expected = {
        name: sum(pool.usable(i) for i in members) for name, members in pool.domains("rack").items()
    }
    assert pool._domain_index("rack").free == expected
    # the table indexed the level on its own free GPUs (the pool's changes are not its own)
    assert table.domains["rack"].free == sums(nodes, "rack")
    # and the next pass's pool copies it
    assert NodePool(table)._domain_index("rack").free == sums(nodes, "rack")


def test_the_ranks_a_domain_holds_when_empty_are_remembered_per_request_shape() -> None:
    nodes = [racked("a", "r1", 0), racked("b", "r1", 8), racked("c", "r2", 8)]
    table = NodeTable(nodes)
    gang = ResourceRequest(num_workers=12, gpus_per_worker=1, cpus_per_worker=0.0, topology=RACK)
    assert NodePool(table).domain_ranks_empty(gang) == {"r1": 16, "r2": 8}
    one = replace(gang, single_node=True, num_workers=4)
    assert NodePool(table).domain_ranks_empty(one) == {"r1": 8, "r2": 8}
    assert len(table.domain_ranks) == 2
    # a change of free GPUs keeps the memo; a change of labels starts afresh
    moved = table.updated({"a": replace(nodes[0], free_gpus=8)})
    assert moved.domain_ranks is table.domain_ranks
    relabelled = moved.updated({"c": replace(nodes[2], labels={"rack": "r1"})})
    assert relabelled.domain_ranks == {}
    assert NodePool(relabelled).domain_ranks_empty(gang) == {"r1": 24}


def test_closest_looks_at_a_domain_s_nodes_in_the_order_of_the_whole_cluster() -> None:
    rng = random.Random(2)
    for _ in range(100):
        pool = NodePool(cluster(rng, racks=3, per_rack=5))
        if rng.random() < 0.5:
            pool = pool.copy({f"r{rng.randrange(3)}-n{rng.randrange(5)}": rng.randint(0, 4)})
        members = pool.domains("rack")[f"r{rng.randrange(3)}"]
        walked = [key for key in pool._closest_order() if key.node_id in members]
        assert list(pool._closest_order(members)) == walked
