"""SJF and Tiresias-style 2D-LAS, and the decayed-usage arithmetic."""

from __future__ import annotations

import math

import pytest

from trainhub.core.fairshare import (
    advance_usage,
    apportion_guarantees,
    decay_factor,
    jain_index,
    mean_life_s,
)
from trainhub.core.scheduling import (
    LasConfig,
    LeastAttainedServicePolicy,
    ShortestJobFirstPolicy,
    Start,
    create_policy,
)
from trainhub.core.scheduling.decisions import split_decisions

from .helpers import by_id, check_contract, node, preempted, queued, running, snapshot


def test_sjf_starts_the_shortest_first_and_skips_what_does_not_fit() -> None:
    snap = snapshot(
        nodes=[node("a", 2)],
        queue=[
            queued(1, duration=100.0),
            queued(2, gpus=4, duration=1.0),
            queued(3, duration=50.0),
        ],
    )
    out = list(ShortestJobFirstPolicy().decide(snap))
    check_contract(snap, out)
    d = by_id(out)
    assert isinstance(d[3], Start)
    assert isinstance(d[1], Start)
    assert not isinstance(d[2], Start)


def test_las_prefers_less_attained_service_and_preempts_for_it() -> None:
    policy = LeastAttainedServicePolicy(
        LasConfig(thresholds_slot_s=(3600.0,), promote_factor=0.0, min_run_time_s=0.0)
    )
    # the running job has 2 GPU-hours; the new one none
    snap = snapshot(
        nodes=[node("a", 1, free=0)],
        run=[running(10, "t", ["a"], started_at=0.0)],
        queue=[queued(1, at=7000.0)],
        now=7200.0,
    )
    out = policy.decide(snap)
    check_contract(snap, list(out))
    assert preempted(out) == {10}


def test_las_keeps_first_come_first_served_inside_a_queue() -> None:
    policy = LeastAttainedServicePolicy(
        LasConfig(thresholds_slot_s=(3600.0,), promote_factor=0.0, min_run_time_s=0.0)
    )
    snap = snapshot(
        nodes=[node("a", 1, free=0)],
        run=[running(10, "t", ["a"], started_at=100.0)],
        queue=[queued(1, at=150.0)],
        now=200.0,
    )
    assert preempted(policy.decide(snap)) == set()


def test_las_asks_to_be_woken_when_a_running_job_sinks_a_queue() -> None:
    policy = LeastAttainedServicePolicy(
        LasConfig(thresholds_slot_s=(3600.0,), promote_factor=0.0, min_run_time_s=0.0)
    )
    snap = snapshot(
        nodes=[node("a", 1, free=0)],
        run=[running(10, "t", ["a"], started_at=100.0)],
        queue=[queued(1, at=150.0)],
        now=200.0,
    )
    _, _, wake_at = split_decisions(policy.decide(snap))
    assert wake_at == pytest.approx(3700.0, abs=1e-3)


def test_las_promotes_a_starving_job() -> None:
    policy = LeastAttainedServicePolicy(LasConfig(thresholds_slot_s=(3600.0,), promote_factor=2.0))
    # the waiting job ran 1 h before (level 1); it waited 2 h: promoted to the first queue
    waiting = queued(1, at=0.0, attained=3600.0)
    snap = snapshot(
        nodes=[node("a", 1)],
        queue=[waiting, queued(2, at=7000.0)],
        now=7200.0,
    )
    assert isinstance(by_id(policy.decide(snap))[1], Start)


def test_las_config_is_validated() -> None:
    with pytest.raises(ValueError, match="increasing"):
        LasConfig(thresholds_slot_s=(10.0, 5.0))


def test_factory_names_its_policies() -> None:
    assert create_policy("las").name == "las"
    with pytest.raises(ValueError, match="unknown scheduling policy"):
        create_policy("nope")


def test_decayed_usage_halves_after_a_half_life() -> None:
    assert decay_factor(3600.0, 3600.0) == pytest.approx(0.5)
    usage = advance_usage({"a": 100.0}, {}, 3600.0, 3600.0)
    assert usage["a"] == pytest.approx(50.0)


def test_decayed_usage_of_a_steady_allocation_converges_to_slots_times_mean_life() -> None:
    usage: dict[str, float] = {}
    for _ in range(100):
        usage = advance_usage(usage, {"a": 4}, 3600.0, 3600.0)
    assert usage["a"] == pytest.approx(4 * mean_life_s(3600.0))


def test_decayed_usage_does_not_depend_on_the_tick() -> None:
    coarse = advance_usage({"a": 10.0}, {"a": 2}, 1000.0, 500.0)
    fine: dict[str, float] = {"a": 10.0}
    for _ in range(10):
        fine = advance_usage(fine, {"a": 2}, 100.0, 500.0)
    assert coarse["a"] == pytest.approx(fine["a"])


def test_guarantees_are_apportioned_with_a_minimum() -> None:
    shares = apportion_guarantees({"a": 70.0, "b": 29.9, "c": 0.1}, 10)
    # c's minimum comes out of the largest share
    assert shares == {"a": 6, "b": 3, "c": 1}
    assert sum(shares.values()) == 10


def test_jain_index() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert math.isclose(jain_index({}), 1.0)
