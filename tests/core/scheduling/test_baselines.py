"""SJF and Tiresias-style 2D-LAS, and the decayed-usage arithmetic."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from trainhub.core.fairshare import (
    advance_usage,
    apportion_guarantees,
    decay_factor,
    jain_index,
    mean_life_s,
)
from trainhub.core.resources import ResourceRequest
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


def test_las_admits_cpu_trials_after_the_gpu_budget_is_spent() -> None:
    """Each kind of slot has its own budget: once the GPUs are all admitted, the GPU jobs left
    wait or are preempted, and a CPU-only job behind them in the order still starts."""
    policy = LeastAttainedServicePolicy(
        LasConfig(thresholds_slot_s=(3600.0,), promote_factor=0.0, min_run_time_s=0.0)
    )
    cpu_only = replace(queued(3, at=7100.0), request=ResourceRequest(1, 0, 4.0, 0.0))
    snap = snapshot(
        nodes=[node("a", 2, free=0, cpus=8.0)],
        # two old GPU jobs of 2 GPU-hours each: below every new job in the order
        run=[running(10, "t", ["a"], started_at=0.0), running(11, "t", ["a"], started_at=0.0)],
        queue=[queued(1, at=7000.0, gpus=2), queued(2, at=7050.0), cpu_only],
        now=7200.0,
    )
    out = policy.decide(snap)
    check_contract(snap, list(out))
    decided = by_id(out)
    assert isinstance(decided[3], Start)  # 4 of the node's 8 CPUs: the GPU jobs took none
    assert not isinstance(decided[1], Start)  # the GPUs are still held by 10 and 11
    assert not isinstance(decided[2], Start)  # behind 1, the GPU budget is spent
    assert preempted(out) == {10, 11}


def test_las_decides_as_a_fresh_policy_while_trials_come_go_and_sink() -> None:
    """The policy keeps the running order between passes; over passes in which jobs start,
    end and sink a queue as time goes on, it decides as a policy that sees each pass first."""
    config = LasConfig(thresholds_slot_s=(600.0, 3600.0), promote_factor=2.0, min_run_time_s=60.0)
    kept = LeastAttainedServicePolicy(config)
    rng = random.Random(7)
    nodes = [node(f"n{i}", 4, free=0) for i in range(6)]
    run = [running(i, "t", [f"n{i % 6}"], started_at=rng.uniform(0, 500)) for i in range(24)]
    waiting = [
        queued(100 + i, at=rng.uniform(0, 500), attained=rng.choice([0.0, 900.0]))
        for i in range(30)
    ]
    next_id = 200
    for step in range(40):
        now = 500.0 + 60.0 * step
        for _ in range(2):  # one job ends and another takes its GPU; one job arrives
            gone = run.pop(rng.randrange(len(run)))
            run.append(running(next_id, "t", gone.placement, started_at=now - rng.uniform(0, 60)))
            waiting.append(queued(next_id + 1, at=now))
            next_id += 2
        snap = snapshot(nodes=nodes, queue=waiting, run=run, now=now)
        fresh = LeastAttainedServicePolicy(config)
        assert split_decisions(kept.decide(snap)) == split_decisions(fresh.decide(snap)), step
