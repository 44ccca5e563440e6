"""Memory and CPUs count in placement; guarantees beyond the cluster are scaled down."""

from __future__ import annotations

import pytest

from trainhub.core.fairshare import guarantee_note, scaled_guarantees
from trainhub.core.resources import Node, ResourceRequest
from trainhub.core.scheduling import (
    POLICY_NAMES,
    Pending,
    QueuedTrial,
    RunningTrial,
    Snapshot,
    Start,
    TenantShare,
    create_policy,
)
from trainhub.core.scheduling.view import NodeFacts, TrialFacts, build_snapshot
from trainhub.core.states import TrialState


def _node(name: str, memory: float = 64.0, cpus: float = 32.0) -> Node:
    return Node(
        node_id=name,
        total_gpus=8,
        total_cpus=cpus,
        free_gpus=8,
        free_cpus=cpus,
        total_memory_gb=memory,
        free_memory_gb=memory,
    )


def _trial(trial_id: int, memory: float = 0.0, cpus: float = 1.0, workers: int = 1) -> QueuedTrial:
    request = ResourceRequest(
        workers, gpus_per_worker=1, cpus_per_worker=cpus, memory_gb_per_worker=memory
    )
    return QueuedTrial(trial_id, "t", request, submitted_at=float(trial_id))


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_memory_per_worker_limits_placement_and_the_wait_names_memory(name: str) -> None:
    nodes = (_node("a"), _node("b"))
    queue = tuple(_trial(i, memory=48.0) for i in (1, 2, 3))
    snap = Snapshot(0.0, nodes, queue, (), {"t": TenantShare()}, {})
    decisions = {d.trial_id: d for d in create_policy(name).decide(snap)}
    started = [d for d in decisions.values() if isinstance(d, Start)]
    # 48 GB per worker: one trial per 64 GB node, though each node has 8 free GPUs
    assert sorted(p for d in started for p in d.placement) == ["a", "b"]
    waiting = decisions[3]
    assert isinstance(waiting, Pending)
    assert "memory" in waiting.reason
    assert "48 GB" in waiting.reason


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_cpus_per_worker_limit_placement_and_the_wait_names_cpus(name: str) -> None:
    nodes = (_node("a", cpus=8.0),)
    queue = (_trial(1, cpus=6.0), _trial(2, cpus=6.0))
    snap = Snapshot(0.0, nodes, queue, (), {"t": TenantShare()}, {})
    decisions = {d.trial_id: d for d in create_policy(name).decide(snap)}
    assert isinstance(decisions[1], Start)
    second = decisions[2]
    assert isinstance(second, Pending)
    assert "CPUs" in second.reason


def test_free_memory_is_counted_by_the_books_in_the_snapshot() -> None:
    holder = TrialFacts(
        trial_id=1,
        tenant="t",
        state=TrialState.RUNNING,
        request=ResourceRequest(1, gpus_per_worker=1, memory_gb_per_worker=40.0),
        placement=("a",),
        attempt_started_at=0.0,
    )
    waiting = TrialFacts(
        trial_id=2,
        tenant="t",
        state=TrialState.QUEUED,
        request=ResourceRequest(1, gpus_per_worker=1, memory_gb_per_worker=40.0),
    )
    facts = [NodeFacts(node_id="a", total_gpus=8, total_cpus=32.0, total_memory_gb=64.0)]
    snap = build_snapshot(10.0, [holder, waiting], facts)
    (decision,) = create_policy("fifo").decide(snap)
    assert isinstance(decision, Pending)
    assert "largest free is 24 GB" in decision.reason


def test_guarantees_beyond_the_cluster_are_scaled_to_fit() -> None:
    assert scaled_guarantees({"a": 8, "b": 8}, 16) == {"a": 8, "b": 8}
    assert scaled_guarantees({"a": 24, "b": 8}, 16) == {"a": 12, "b": 4}
    assert sum(scaled_guarantees({"a": 7, "b": 7, "c": 7}, 16).values()) == 16
    assert guarantee_note({"a": 8}, 16) is None
    note = guarantee_note({"a": 24, "b": 8}, 16)
    assert note is not None
    assert "32 GPUs" in note
    assert "16" in note


def test_a_reclaim_under_scaled_guarantees_says_they_were_scaled() -> None:
    # tenants a and b each say 16 GPUs on a 16-GPU cluster: each really gets 8
    nodes = (
        Node("a0", 8, 64.0, 0, 64.0),
        Node("a1", 8, 64.0, 0, 64.0),
    )
    request = ResourceRequest(8, gpus_per_worker=1)
    running = (
        RunningTrial(1, "a", request, ("a0",) * 8, started_at=0.0),
        RunningTrial(2, "a", request, ("a1",) * 8, started_at=0.0),
    )
    queue = (QueuedTrial(3, "b", request, submitted_at=5.0, queued_at=5.0),)
    tenants = {"a": TenantShare(16), "b": TenantShare(16)}
    snap = Snapshot(10_000.0, nodes, queue, running, tenants, {})
    decisions = list(create_policy("fair").decide(snap))
    pending = [d for d in decisions if isinstance(d, Pending)]
    assert len(pending) == 1
    assert "guaranteed 8 GPUs" in pending[0].reason
    assert "scaled down" in pending[0].reason
    # without scaling, tenant a (16 of its 16) would not be above its guarantee at all
    assert sum(1 for d in decisions if type(d).__name__ == "Preempt") == 1


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_trial_asking_less_memory_is_not_held_behind_one_asking_more(name: str) -> None:
    """Trials of one tenant and GPU shape that ask different memory per rank do not wait for
    the same capacity: the one that fits starts while the other waits for memory (FIFO's
    order holds it behind the head, as any other trial)."""
    nodes = (_node("a", memory=64.0),)
    queue = (_trial(1, memory=48.0), _trial(2, memory=40.0), _trial(3, memory=8.0))
    snap = Snapshot(0.0, nodes, queue, (), {"t": TenantShare()}, {})
    decisions = {d.trial_id: d for d in create_policy(name).decide(snap)}
    assert isinstance(decisions[1], Start)
    assert isinstance(decisions[2], Pending)
    assert "memory" in decisions[2].reason
    # 16 GB are left on the node: trial 3 fits them
    if name == "fifo":
        assert isinstance(decisions[3], Pending)
        assert "behind trial 2" in decisions[3].reason
    else:
        assert isinstance(decisions[3], Start), decisions[3]
