"""Gang placement: pack, spread, single node, labels, temperatures, reservations' caps."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from trainhub.core.resources import ResourceRequest, can_ever_fit
from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.placement import NoFit, place
from trainhub.core.scheduling.reservation import reserve
from trainhub.core.scheduling.runningtable import RunningTable
from trainhub.core.spec import Placement

from .helpers import node, queued, request, running


def test_pack_puts_a_small_gang_on_the_tightest_node() -> None:
    nodes = [node("a", 8, free=8), node("b", 8, free=3), node("c", 8, free=5)]
    assert place(request(3), nodes) == ("b", "b", "b")


def test_pack_uses_the_fewest_nodes_for_a_large_gang() -> None:
    nodes = [node("a", 8, free=2), node("b", 8, free=8), node("c", 8, free=8), node("d", 8, free=6)]
    ranks = place(request(12), nodes)
    assert isinstance(ranks, tuple)
    assert len(ranks) == 12
    counts = Counter(ranks)
    assert (len(counts) == 2 and counts["b"] == 8) or counts["c"] == 8


def test_spread_puts_ranks_on_different_nodes() -> None:
    nodes = [node(n, 4) for n in "abcd"]
    ranks = place(request(3, placement=Placement.SPREAD), nodes)
    assert isinstance(ranks, tuple)
    assert len(set(ranks)) == 3


def test_single_node_never_splits() -> None:
    nodes = [node("a", 8, free=6), node("b", 8, free=6)]
    result = place(request(8, single_node=True), nodes)
    assert isinstance(result, NoFit)
    assert not result.never
    assert "largest free is 6" in result.reason
    never = place(request(16, single_node=True), nodes)
    assert isinstance(never, NoFit)
    assert never.never


def test_labels_restrict_the_nodes() -> None:
    nodes = [node("a", 8, model="V100"), node("b", 8, model="A100")]
    assert place(request(2, labels={"gpu_model": "A100"}), nodes) == ("b", "b")
    missing = place(request(1, labels={"gpu_model": "H100"}), nodes)
    assert isinstance(missing, NoFit)
    assert missing.never
    assert "gpu_model=H100" in missing.reason


def test_cooler_gpus_are_preferred_among_equal_nodes() -> None:
    nodes = [node("a", 8, temp=70.0), node("b", 8, temp=45.0), node("c", 8, temp=60.0)]
    assert place(request(1), nodes) == ("b",)
    spread = place(request(2, placement=Placement.SPREAD), nodes)
    assert spread == ("b", "c")


def test_hot_nodes_are_used_only_when_nothing_cooler_fits() -> None:
    # the hot node is the tighter fit, but it is above the threshold
    nodes = [node("hot", 8, free=1, temp=90.0), node("cool", 8, free=8, temp=50.0)]
    assert place(request(1), nodes) == ("cool",)
    full = [node("hot", 8, free=1, temp=90.0), node("cool", 8, free=0, temp=50.0)]
    assert place(request(1), full) == ("hot",)


def test_unknown_temperature_ranks_after_known_cool_ones() -> None:
    nodes = [node("unknown", 8), node("cool", 8, temp=40.0)]
    assert place(request(1), nodes) == ("cool",)


def test_caps_limit_what_a_pool_lends_on_a_node() -> None:
    pool = NodePool([node("a", 8, free=8), node("b", 8, free=2)])
    capped = pool.copy({"a": 1})
    assert capped.place(request(2)) == ("b", "b")
    assert capped.place(request(4)) is None
    ranks = capped.place(request(1))
    assert ranks is not None
    capped.take(request(1), ranks)
    assert capped.total_free == 2


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), min_size=1, max_size=6),
    st.integers(1, 20),
    st.sampled_from(list(Placement)),
    st.booleans(),
)
def test_a_placement_is_whole_and_within_free_capacity(
    shapes: list[tuple[int, int]], gpus: int, placement: Placement, single: bool
) -> None:
    nodes = [node(f"n{i}", max(t, f), free=min(t, f)) for i, (t, f) in enumerate(shapes)]
    req = request(gpus, placement=placement, single_node=single)
    result = place(req, nodes)
    free = {n.node_id: n.free_gpus for n in nodes}
    if isinstance(result, NoFit):
        # it really does not fit: fewer free GPUs than asked, or no node big enough
        fits_one = max(free.values()) >= gpus
        assert (single and not fits_one) or sum(free.values()) < gpus
        return
    assert len(result) == gpus
    for n, count in Counter(result).items():
        assert count <= free[n]
    if single:
        assert len(set(result)) == 1


def test_a_reservation_without_known_ends_counts_only_trials_being_preempted() -> None:
    nodes = [node("a", 8, free=0), node("b", 8, free=0)]
    ending = running(10, "x", ["a"] * 8, started_at=0.0, duration=100.0)
    leaving = running(11, "x", ["b"] * 8, started_at=0.0, preempting=True)
    table = RunningTable((ending, leaving))
    head = queued(1, gpus=8, single_node=True)
    trusted = reserve(head, NodePool(nodes), table, now=50.0)
    assert trusted.start_at == 50.0  # the preempted trial leaves now, before the other ends
    # an expected end alone no longer times the reservation
    alone = RunningTable((ending,))
    assert reserve(head, NodePool(nodes), alone, now=50.0).start_at == 100.0
    assert reserve(head, NodePool(nodes), alone, now=50.0, known_ends=False).start_at is None
    untrusted = reserve(head, NodePool(nodes), table, now=50.0, known_ends=False)
    assert untrusted.start_at == 50.0
    assert set(untrusted.ranks) == {"b"}


def test_a_request_that_fits_only_a_cordoned_node_waits_for_it_by_name() -> None:
    from dataclasses import replace

    held = replace(node("gpu-a", 8), alive=False, cordoned=True)
    result = place(request(4), [held, node("gpu-b", 2)])
    assert isinstance(result, NoFit)
    assert "cordoned" in result.reason
    assert "gpu-a" in result.reason
    assert "whole cluster holds" not in result.reason
    assert "uncordon" in result.reason
    # a node that is gone (not alive, not cordoned) still makes a request impossible
    gone = replace(node("gpu-a", 8), alive=False)
    lost = place(request(4), [gone, node("gpu-b", 2)])
    assert isinstance(lost, NoFit)
    assert "cordoned" not in lost.reason
    assert "whole cluster holds 2" in lost.reason


def test_a_held_node_is_named_by_its_host_and_for_what_holds_it() -> None:
    from dataclasses import replace

    def held(name: str, why: str) -> object:
        return replace(node(name, 8), alive=False, cordoned=True, held=why, hostname=f"{name}.lab")

    cordoned = place(request(4), [held("gpu-a", "cordoned"), node("gpu-b", 2)])
    assert isinstance(cordoned, NoFit)
    assert "the node it fits on is cordoned (gpu-a.lab)" in cordoned.reason
    assert "uncordons it" in cordoned.reason
    assert "unhealthy" not in cordoned.reason
    sick = place(request(4), [held("gpu-a", "unhealthy"), node("gpu-b", 2)])
    assert isinstance(sick, NoFit)
    assert "is unhealthy (gpu-a.lab)" in sick.reason
    assert "healthy again" in sick.reason
    assert "uncordon" not in sick.reason
    draining = place(request(4), [held("gpu-a", "draining"), node("gpu-b", 2)])
    assert isinstance(draining, NoFit)
    assert "is draining (gpu-a.lab)" in draining.reason
    both = place(request(4), [held("gpu-a", "cordoned"), held("gpu-c", "unhealthy")])
    assert isinstance(both, NoFit)
    assert "are cordoned (gpu-a.lab), unhealthy (gpu-c.lab)" in both.reason
    assert "once one takes trials again" in both.reason


def test_the_scheduling_view_marks_a_node_held_by_the_monitor_as_cordoned() -> None:
    from trainhub.core.scheduling.view import NodeFacts
    from trainhub.service.scheduling_view import with_overlay

    facts = NodeFacts(node_id="gpu-a", total_gpus=8, total_cpus=64.0)
    held = with_overlay(facts, {"gpu-a": (False, None)})
    assert (held.alive, held.cordoned) == (False, True)
    sick = with_overlay(facts, {"gpu-a": (False, None, "unhealthy")})
    assert (sick.cordoned, sick.held) == (True, "unhealthy")
    assert with_overlay(facts, {"gpu-a": (True, None)}).cordoned is False


# -- tensor-parallel groups (issue 28): a group's consecutive ranks share one node ------------


def grouped(gpus: int, group: int, placement: Placement = Placement.PACK) -> ResourceRequest:
    return replace(request(gpus, placement=placement), group_size=group)


def test_a_tensor_group_is_never_split_across_nodes() -> None:
    nodes = [node("a", 8, free=3), node("b", 8, free=3)]
    assert place(request(4), nodes) == ("a", "a", "a", "b")  # three and one, ungrouped
    assert place(grouped(4, 2), nodes) == ("a", "a", "b", "b")  # two whole groups


def test_a_gang_that_fits_only_by_splitting_a_group_waits() -> None:
    nodes = [node("a", 8, free=3), node("b", 8, free=1)]
    assert isinstance(place(grouped(4, 2), nodes), NoFit)
    assert isinstance(place(request(4), nodes), tuple)


def test_spread_spreads_whole_groups() -> None:
    nodes = [node(n, 4) for n in "abc"]
    ranks = place(grouped(6, 2, Placement.SPREAD), nodes)
    assert ranks == ("a", "a", "b", "b", "c", "c")


def test_the_submit_check_names_the_tensor_field_when_groups_cannot_fit() -> None:
    nodes = [node("a", 3), node("b", 1)]
    assert can_ever_fit(request(4), nodes) is None
    unfit = can_ever_fit(grouped(4, 2), nodes)
    assert unfit is not None
    assert "groups of 2" in unfit.message


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)), min_size=1, max_size=6),
    st.integers(1, 6),
    st.sampled_from([2, 4]),
    st.sampled_from(list(Placement)),
)
def test_every_group_lands_whole_on_one_node(
    shapes: list[tuple[int, int]], groups: int, size: int, placement: Placement
) -> None:
    nodes = [node(f"n{i}", max(t, f), free=min(t, f)) for i, (t, f) in enumerate(shapes)]
    result = place(grouped(groups * size, size, placement), nodes)
    free = {n.node_id: n.free_gpus for n in nodes}
    if isinstance(result, NoFit):
        assert sum(f // size for f in free.values()) < groups  # no room for that many groups
        return
    assert len(result) == groups * size
    for g in range(groups):
        assert len(set(result[g * size : (g + 1) * size])) == 1
    for n, count in Counter(result).items():
        assert count <= free[n]
