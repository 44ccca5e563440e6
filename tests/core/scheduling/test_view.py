"""The one snapshot builder: facts in, the policy's view out, the same by both feeding paths."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from trainhub.core.fairshare import DecayedUsage
from trainhub.core.resources import Node, ResourceRequest, can_ever_fit, largest_node_capacity
from trainhub.core.scheduling import POLICY_NAMES, TenantShare, create_policy, split_decisions
from trainhub.core.scheduling.view import (
    DurationEstimates,
    NodeFacts,
    SnapshotBuilder,
    TrialFacts,
    build_snapshot,
    estimate_duration,
    tenant_load,
)
from trainhub.core.states import TrialState

from .helpers import node as helper_node
from .helpers import queued as helper_queued
from .helpers import running as helper_running
from .helpers import snapshot as helper_snapshot

Q, R, P = TrialState.QUEUED, TrialState.RUNNING, TrialState.PREEMPTING


def req(workers: int = 1, gpus: int = 1, cpus: float = 1.0, memory: float = 0.0) -> ResourceRequest:
    return ResourceRequest(
        num_workers=workers, gpus_per_worker=gpus, cpus_per_worker=cpus, memory_gb_per_worker=memory
    )


def nodes(count: int = 2, gpus: int = 8, memory: float = 64.0) -> list[NodeFacts]:
    return [
        NodeFacts(node_id=f"n{i}", total_gpus=gpus, total_cpus=32.0, total_memory_gb=memory)
        for i in range(count)
    ]


def test_views_carry_every_fact_a_policy_reads() -> None:
    queued = TrialFacts(
        trial_id=1,
        tenant="a",
        user="ann",
        project="vision",
        state=Q,
        request=req(2),
        submitted_at=5.0,
        queued_at=7.0,
        attained_service=100.0,
        progress_s=300.0,
        expected_duration_s=1000.0,
    )
    run = TrialFacts(
        trial_id=2,
        tenant="b",
        user="bob",
        state=R,
        request=req(2, memory=16.0),
        placement=("n0", "n0"),
        attempt_started_at=50.0,
        attained_service=40.0,
        last_checkpoint_at=80.0,
        checkpoint_every_s=600.0,
        expected_duration_s=500.0,
        preemptible=False,
        num_preemptions=2,
    )
    done = replace(queued, trial_id=3, state=TrialState.COMPLETED)
    snap = build_snapshot(100.0, [queued, run, done], nodes(), {"a": TenantShare(4)}, {"a": 1.0})
    (q,) = list(snap.queue)
    assert (q.trial_id, q.user, q.expected_duration_s, q.attained_service) == (
        1,
        "ann",
        700.0,
        100.0,
    )
    assert q.queued_at == 7.0
    assert q.submitted_at == 5.0
    (r,) = snap.running
    assert r.attained_at(100.0) == pytest.approx(40.0 + 2 * 50.0)
    assert r.work_at_risk_s(100.0) == pytest.approx(20.0)
    assert (r.preemptible, r.num_preemptions, r.user, r.expected_duration_s) == (
        False,
        2,
        "bob",
        500.0,
    )
    by_id = {n.node_id: n for n in snap.nodes}
    # free capacity by the books: totals minus what the running trial holds
    assert (by_id["n0"].free_gpus, by_id["n0"].free_cpus, by_id["n0"].free_memory_gb) == (
        6,
        30.0,
        32.0,
    )
    assert by_id["n1"].free_gpus == 8
    assert snap.tenants["a"].guaranteed_slots == 4
    assert snap.tenant_usage["a"] == 1.0


def test_preempting_trial_is_marked_and_temperatures_and_health_pass_through() -> None:
    facts = TrialFacts(
        trial_id=1, tenant="a", state=P, request=req(), placement=("n0",), attempt_started_at=0.0
    )
    hot = [
        NodeFacts(node_id="n0", total_gpus=8, total_cpus=8.0, gpu_temperature_c=91.0),
        NodeFacts(node_id="n1", total_gpus=8, total_cpus=8.0, alive=False),
    ]
    snap = build_snapshot(1.0, [facts], hot)
    assert snap.running[0].preempting
    assert [n.gpu_temperature_c for n in snap.nodes] == [91.0, None]
    assert [n.alive for n in snap.nodes] == [True, False]


def _random_events(seed: int, steps: int) -> list[list[TrialFacts]]:
    """States of a small cluster over time: trials arrive, start, get preempted, finish."""
    rng = random.Random(seed)
    live: dict[int, TrialFacts] = {}
    free = {"n0": 8, "n1": 8, "n2": 4}
    out: list[list[TrialFacts]] = []
    next_id = 0
    for step in range(steps):
        now = float(step * 10)
        roll = rng.random()
        if roll < 0.4:
            next_id += 1
            live[next_id] = TrialFacts(
                trial_id=next_id,
                tenant=rng.choice("abc"),
                user=rng.choice(["u", "v"]),
                state=Q,
                request=req(rng.choice([1, 2, 4])),
                submitted_at=now,
                queued_at=now,
                expected_duration_s=rng.choice([None, 100.0, 1000.0]),
            )
        elif roll < 0.7:
            waiting = [t for t in live.values() if t.state == Q]
            if waiting:
                t = rng.choice(waiting)
                room = [n for n, f in free.items() if f >= t.request.num_workers]
                if room:
                    where = rng.choice(room)
                    free[where] -= t.request.num_workers
                    live[t.trial_id] = replace(
                        t,
                        state=R,
                        placement=(where,) * t.request.num_workers,
                        attempt_started_at=now,
                        last_checkpoint_at=now,
                        checkpoint_every_s=rng.choice([None, 60.0]),
                    )
        else:
            active = [t for t in live.values() if t.state in (R, P)]
            if active:
                t = rng.choice(active)
                if t.state == R and rng.random() < 0.5:
                    live[t.trial_id] = replace(t, state=P)
                else:
                    free[t.placement[0]] += t.request.num_workers
                    if rng.random() < 0.5:
                        del live[t.trial_id]
                    else:
                        live[t.trial_id] = replace(
                            t,
                            state=Q,
                            placement=(),
                            queued_at=now,
                            attempt_started_at=None,
                            attained_service=t.attained_service + 10.0,
                            num_preemptions=t.num_preemptions + 1,
                        )
        out.append(list(live.values()))
    return out


@pytest.mark.parametrize("policy_name", POLICY_NAMES)
def test_full_and_incremental_feeding_give_the_same_decisions(policy_name: str) -> None:
    """The control loop's path (all facts every tick) and the simulator's (only changes)."""
    full_policy = create_policy(policy_name)
    step_policy = create_policy(policy_name)
    full = SnapshotBuilder.for_policy(full_policy)
    stepped = SnapshotBuilder.for_policy(step_policy)
    cluster = [
        NodeFacts(node_id="n0", total_gpus=8, total_cpus=64.0),
        NodeFacts(node_id="n1", total_gpus=8, total_cpus=64.0, gpu_temperature_c=90.0),
        NodeFacts(node_id="n2", total_gpus=4, total_cpus=64.0),
    ]
    stepped.set_nodes(cluster)
    tenants = {"a": TenantShare(8), "b": TenantShare(8), "c": TenantShare(4)}
    before: dict[int, TrialFacts] = {}
    compared = 0
    for step, state in enumerate(_random_events(7, 200)):
        now = float(step * 10)
        usage = {"a": now, "b": 2 * now, "c": 0.0}
        current = {t.trial_id: t for t in state}
        changed = [t for i, t in current.items() if before.get(i) is not t]
        stepped.update(changed, [i for i in before if i not in current])
        before = current
        one = full.build(now, state, cluster, tenants, usage)
        two = stepped.snapshot(now, tenants, usage)
        fresh = build_snapshot(now, state, cluster, tenants, usage, full_policy.queue_order)
        assert sorted(map(repr, one.queue)) == sorted(map(repr, two.queue))
        assert sorted(map(repr, one.running)) == sorted(map(repr, fresh.running))
        assert list(one.nodes) == list(two.nodes) == list(fresh.nodes)
        decided = list(full_policy.decide(one))
        assert decided == list(step_policy.decide(two))
        compared += len(decided)
    assert compared > 50


def test_estimate_duration_prefers_the_closest_history() -> None:
    history = [("ann", "vision", 100.0)] * 3 + [("bob", "vision", 900.0)] * 4
    assert estimate_duration(history, "ann", "vision") == 100.0
    assert estimate_duration(history, "cid", "vision") == 900.0
    assert estimate_duration(history, "bob", "nlp") == 900.0
    assert estimate_duration(history, "cid", "nlp") is None


def test_duration_estimates_one_run_at_a_time_equal_the_estimate_over_all_runs() -> None:
    rng = random.Random(7)
    estimates = DurationEstimates()
    history: list[tuple[str, str, float]] = []
    users, projects = ("ann", "bob", "cid"), ("vision", "nlp")
    checked = 0
    for _ in range(200):
        run = (rng.choice(users), rng.choice(projects), float(rng.randint(1, 1000)))
        estimates.add(*run)
        history.append(run)
        for user in (*users, "dan"):
            for project in (*projects, "speech"):
                assert estimates.estimate(user, project) == estimate_duration(
                    history, user, project
                )
                checked += estimates.estimate(user, project) is not None
    assert checked > 1000


def test_a_window_of_duration_estimates_counts_only_the_latest_runs() -> None:
    """As the server reads only the latest finished trials (``FINISHED_RUNS_READ``)."""
    rng = random.Random(11)
    estimates = DurationEstimates(window=25)
    history: list[tuple[str, str, float]] = []
    for _ in range(300):
        run = (rng.choice(("ann", "bob")), rng.choice(("vision", "nlp")), float(rng.randint(1, 99)))
        estimates.add(*run)
        history.append(run)
        for user in ("ann", "bob"):
            for project in ("vision", "nlp"):
                assert estimates.estimate(user, project) == estimate_duration(
                    history[-25:], user, project
                )
    # the oldest runs are gone: a run of 1,000 s added first weighs nothing 25 runs later
    estimates = DurationEstimates(min_samples=1, window=2)
    for run_s in (1000.0, 10.0, 20.0):
        estimates.add("ann", "vision", run_s)
    assert estimates.estimate("ann", "vision") == 15.0
    with pytest.raises(ValueError, match="window"):
        DurationEstimates(window=0)


def test_decayed_usage_by_changes_equals_usage_by_ticks() -> None:
    half_life = 600.0
    by_change = DecayedUsage(half_life, 0.0, ["a", "b"])
    by_tick = DecayedUsage(half_life)
    by_tick.advance({}, 0.0)
    holding = {"a": 0.0, "b": 0.0}
    rng = random.Random(1)
    for t in range(10, 3000, 10):
        by_tick.advance(holding, float(t))  # held over the last ten seconds
        for tenant in "ab":
            delta = rng.choice([-1.0, 0.0, 1.0]) if holding[tenant] > 0 else rng.choice([0.0, 2.0])
            if delta:
                by_change.change(tenant, float(t), delta)
                holding[tenant] += delta
    by_change.now = 3000.0
    ticked = by_tick.advance(holding, 3000.0)
    assert ticked["a"] == pytest.approx(by_change["a"])
    assert ticked["b"] == pytest.approx(by_change["b"])
    assert math.isclose(by_change.half_life_s, half_life)


def _node(gpus: int, cpus: float = 32.0, memory: float = 256.0, alive: bool = True) -> Node:
    return Node(
        node_id=f"n{gpus}-{cpus}-{memory}",
        total_gpus=gpus,
        total_cpus=cpus,
        free_gpus=0,
        free_cpus=0.0,
        alive=alive,
        total_memory_gb=memory,
        free_memory_gb=0.0,
    )


def test_can_ever_fit_names_the_field_and_the_largest_node() -> None:
    cluster = [_node(8, 64.0, 512.0), _node(4, 32.0, 128.0), _node(16, 8.0, 64.0, alive=False)]
    largest = largest_node_capacity(cluster)
    assert largest is not None
    assert (largest.gpus, largest.cpus, largest.memory_gb) == (8, 64, 512)
    assert can_ever_fit(req(2, gpus=4, memory=200.0), cluster) is None
    memory = can_ever_fit(req(1, memory=600.0), cluster)
    assert memory is not None
    assert memory.field == "resources.memory_gb_per_worker"
    assert "600 GB" in memory.message
    assert "512 GB" in memory.message
    gpus = can_ever_fit(req(1, gpus=16), cluster)
    assert gpus is not None
    assert gpus.field == "resources.gpus_per_worker"
    assert "8 GPUs" in str(gpus)
    cpus = can_ever_fit(req(1, cpus=100.0), cluster)
    assert cpus is not None
    assert cpus.field == "resources.cpus_per_worker"
    # each resource fits some node, but no node holds all of one worker
    mixed = can_ever_fit(
        req(1, gpus=8, memory=300.0, cpus=1.0), [_node(8, 64.0, 128.0), _node(2, 8.0, 512.0)]
    )
    assert mixed is not None
    assert mixed.field == "resources"
    single = can_ever_fit(replace(req(3, gpus=4), single_node=True), cluster)
    assert single is not None
    assert single.field == "resources.workers"
    whole = can_ever_fit(req(4, gpus=4), cluster)
    assert whole is not None
    assert "at most 3" in whole.message
    assert can_ever_fit(req(), [_node(8, alive=False)]) is not None


def test_tenant_load_counts_held_and_queued_slots_per_tenant() -> None:
    snap = helper_snapshot(
        nodes=[helper_node("n", 8, free=2)],
        run=[helper_running(1, "a", ["n", "n"]), helper_running(2, "b", ["n"] * 4)],
        queue=[
            helper_queued(3, "a", gpus=4),
            helper_queued(4, "a", gpus=4),
            helper_queued(5, "c", gpus=1),
        ],
    )
    held, demand = tenant_load(snap)
    assert held == {"a": 2, "b": 4}
    assert demand == {"a": 10, "b": 4, "c": 1}


@pytest.mark.parametrize("policy_name", POLICY_NAMES)
def test_a_node_holding_more_than_it_has_takes_nothing_and_breaks_no_policy(
    policy_name: str,
) -> None:
    """A node can list fewer GPUs than its running trials hold (it came back smaller, a GPU
    fell off the bus): its free count goes negative, and it must count as full, not as a
    negative bucket of the node pool (the fair pass indexed its buckets by it when a
    reservation capped the node for backfill)."""
    shrunk = [
        NodeFacts(node_id="n0", total_gpus=6, total_cpus=64.0, total_memory_gb=256.0),
        NodeFacts(node_id="n1", total_gpus=8, total_cpus=64.0, total_memory_gb=256.0),
    ]

    def running(trial_id: int, node: str, gpus: int) -> TrialFacts:
        return TrialFacts(
            trial_id=trial_id,
            tenant="a",
            state=TrialState.RUNNING,
            request=req(workers=gpus),
            placement=(node,) * gpus,
            attempt_started_at=0.0,
            expected_duration_s=100.0,
        )

    gang = TrialFacts(
        trial_id=3,
        tenant="b",
        state=TrialState.QUEUED,
        request=req(workers=14),
        expected_duration_s=100.0,
    )
    small = TrialFacts(
        trial_id=4,
        tenant="b",
        state=TrialState.QUEUED,
        request=req(),
        submitted_at=1.0,
        expected_duration_s=10.0,
    )
    trials = [running(1, "n0", 8), running(2, "n1", 7), gang, small]
    tenants = {"a": TenantShare(guaranteed_slots=0), "b": TenantShare(guaranteed_slots=0)}
    snapshot = build_snapshot(10.0, trials, shrunk, tenants)
    assert snapshot.nodes[0].free_gpus == -2
    starts, _, _ = split_decisions(create_policy(policy_name).decide(snapshot))
    assert all("n0" not in start.placement for start in starts)


def test_a_trial_given_twice_in_one_update_counts_as_its_last_facts() -> None:
    # the control loop's read and a refresh of duration estimates both remade a queued trial
    # in one tick: the queue held it once, and removing it twice raised KeyError every tick
    builder = SnapshotBuilder()
    first = TrialFacts(
        trial_id=1, tenant="a", user="u", state=Q, request=req(2), submitted_at=0.0, queued_at=0.0
    )
    builder.update(trials=[first])
    read = replace(first, queued_at=1.0)
    refreshed = replace(read, expected_duration_s=100.0)

    builder.update(trials=[read, refreshed])
    builder.update(gone=[1])  # what raised KeyError: the queue held the read's view twice

    assert len(builder.queue) == 0
    builder.update(trials=[refreshed])
    assert [t.trial_id for run in builder.queue.groups.values() for t in run] == [1]
