"""The incremental indexes of a snapshot equal the ones built from scratch."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from trainhub.core.scheduling import SUBMISSION_ORDER, QueueIndex, TrialQueue
from trainhub.core.scheduling.decisions import DecisionList, Pending, Start
from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.nodetable import NodeTable
from trainhub.core.scheduling.runningtable import RunningTable
from trainhub.core.spec import Priority

from .helpers import node, queued, running


def order(trials: object) -> list[int]:
    return sorted(t.trial_id for t in trials)  # type: ignore[attr-defined]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 399)), max_size=300))
def test_trial_queue_after_adds_and_removes(ops: list[tuple[bool, int]]) -> None:
    pool = [queued(i, tenant="ab"[i % 2], gpus=1 + i % 3, at=float(i % 37)) for i in range(400)]
    queue = TrialQueue((), SUBMISSION_ORDER)
    live: dict[int, object] = {}
    for add, i in ops:
        if add and i not in live:
            live[i] = pool[i]
            queue = queue.added([pool[i]])
        elif not add and live:
            victim = list(live)[i % len(live)]
            queue = queue.removed([live.pop(victim)])  # type: ignore[list-item]
    rebuilt = TrialQueue(live.values(), SUBMISSION_ORDER)  # type: ignore[arg-type]
    assert len(queue) == len(live)
    assert {k: [t.trial_id for t in g] for k, g in queue.groups.items()} == {
        k: [t.trial_id for t in g] for k, g in rebuilt.groups.items()
    }
    for group in queue.groups.values():
        keys = [SUBMISSION_ORDER.key(t) for t in group]
        assert keys == sorted(keys)
        assert [group[i].trial_id for i in range(len(group))] == [t.trial_id for t in group]


def _groups(queue: TrialQueue) -> dict[object, list[tuple[int, Priority, float]]]:
    return {k: [(t.trial_id, t.priority, t.queued_at) for t in g] for k, g in queue.groups.items()}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 59), st.sampled_from(list(Priority)), st.booleans())),
        max_size=8,
    )
)
def test_queue_index_matches_a_rebuild_tick_after_tick(
    ticks: list[list[tuple[int, Priority, bool]]],
) -> None:
    """Each tick the caller reads the whole queue again: some trials came, left, or changed
    priority (a new object) while the rest are the very objects of the last tick."""
    index = QueueIndex(SUBMISSION_ORDER)
    live: dict[int, object] = {}
    for changes in ticks:
        for trial_id, priority, present in changes:
            if present:
                live[trial_id] = queued(trial_id, tenant="ab"[trial_id % 2], priority=priority)
            else:
                live.pop(trial_id, None)
        synced = index.sync(live.values())  # type: ignore[arg-type]
        rebuilt = TrialQueue(live.values(), SUBMISSION_ORDER)  # type: ignore[arg-type]
        assert len(synced) == len(live)
        assert _groups(synced) == _groups(rebuilt)


def test_queue_index_shares_untouched_groups() -> None:
    trials = [queued(i, tenant="ab"[i % 2]) for i in range(20)]
    index = QueueIndex(SUBMISSION_ORDER)
    first = index.sync(trials)
    # one trial of tenant a changes priority; tenant b's group is the same object
    changed = [*trials[:2], queued(2, tenant="a", priority=Priority.HIGH), *trials[3:]]
    second = index.sync(changed)
    b_group = next(k for k in first.groups if k[0] == "b")
    assert second.groups[b_group] is first.groups[b_group]
    assert index.sync(list(changed)) is second  # nothing changed: the same queue


def test_a_plain_tuple_queue_is_indexed_on_the_fly() -> None:
    trials = (queued(2, at=5.0), queued(1, at=1.0))
    indexed = TrialQueue.coerce(trials, SUBMISSION_ORDER)
    assert order(indexed) == [1, 2]
    assert TrialQueue.coerce(indexed, SUBMISSION_ORDER) is indexed


def test_node_table_updates_match_a_rebuild() -> None:
    rng = random.Random(7)
    nodes = [
        node(f"n{i}", 8, free=rng.randint(0, 8), temp=rng.choice([None, 50.0])) for i in range(20)
    ]
    table = NodeTable(nodes)
    for _ in range(200):
        changed = {}
        for n in rng.sample(nodes, 3):
            changed[n.node_id] = replace(n, free_gpus=rng.randint(0, 8))
        nodes = [changed.get(n.node_id, n) for n in nodes]
        table = table.updated(changed)
        fresh = NodeTable(nodes)
        assert list(table) == list(fresh)
        assert [sorted(b) for b in table.buckets] == [sorted(b) for b in fresh.buckets]
        assert table.total_free == fresh.total_free
        assert NodePool(table).place(queued(0, gpus=5).request) == NodePool(fresh).place(
            queued(0, gpus=5).request
        )


def test_running_table_updates_match_a_rebuild() -> None:
    rng = random.Random(3)
    table = RunningTable()
    live: dict[int, object] = {}
    for step in range(300):
        roll = rng.random()
        if live and roll < 0.3:
            gone = rng.choice(list(live))
            del live[gone]
            table = table.updated(removed=[gone])
        elif live and roll < 0.45:
            tid = rng.choice(list(live))
            live[tid] = replace(live[tid], preempting=True)  # type: ignore[type-var]
            table = table.updated([live[tid]])  # type: ignore[list-item]
        else:
            trial = running(
                step, rng.choice("abc"), ["n"] * rng.randint(1, 3), duration=rng.choice([None, 9.0])
            )
            live[step] = trial
            table = table.updated([trial])
        fresh = RunningTable(live.values())  # type: ignore[arg-type]
        assert order(table) == order(fresh)
        assert table.slots_by_tenant == fresh.slots_by_tenant
        assert {t: order(g) for t, g in table.by_tenant.items()} == {
            t: order(g) for t, g in fresh.by_tenant.items()
        }
        assert order(table.preempting) == order(fresh.preempting)
        assert order(table.with_known_end) == order(fresh.with_known_end)


def test_synced_tables_match_a_rebuild_and_keep_untouched_groups() -> None:
    """What the control loop does each tick: read nodes and running trials afresh (nodes as
    equal copies, unchanged trials as the same objects) and sync the tables it keeps."""
    rng = random.Random(11)
    nodes = [node(f"n{i}", 8, free=8) for i in range(12)]
    live = {i: running(i, "abc"[i % 3], [f"n{i % 12}"]) for i in range(9)}
    node_table, run_table = NodeTable(()), RunningTable()
    next_id = 100
    for _ in range(100):
        for _ in range(rng.randint(0, 2)):
            if live:
                del live[rng.choice(list(live))]
        for _ in range(rng.randint(0, 2)):
            live[next_id] = running(next_id, rng.choice("abc"), [f"n{rng.randrange(12)}"])
            next_id += 1
        held = {n.node_id: 0 for n in nodes}
        for trial in live.values():
            for node_id in trial.placement:
                held[node_id] += trial.request.gpus_per_worker
        fresh_nodes = [replace(n, free_gpus=n.total_gpus - held[n.node_id]) for n in nodes]
        before = run_table
        node_table = node_table.synced(fresh_nodes)
        run_table = run_table.synced(list(live.values()))
        rebuilt_nodes, rebuilt_run = NodeTable(fresh_nodes), RunningTable(live.values())
        assert list(node_table) == list(rebuilt_nodes)
        assert node_table.total_free == rebuilt_nodes.total_free
        assert [sorted(b) for b in node_table.buckets] == [sorted(b) for b in rebuilt_nodes.buckets]
        assert order(run_table) == order(rebuilt_run)
        assert run_table.slots_by_tenant == rebuilt_run.slots_by_tenant
        assert {t: order(g) for t, g in run_table.by_tenant.items()} == {
            t: order(g) for t, g in rebuilt_run.by_tenant.items()
        }
        assert run_table.synced(list(live.values())) is run_table  # nothing changed
        gone = [t for t in before if t.trial_id not in live]
        came = [t for t in live.values() if t.trial_id not in before.by_id]
        if len(gone) + len(came) > len(live) // 2:
            continue  # mostly new: the table is rebuilt
        touched = {t.tenant for t in gone + came}
        for tenant, group in run_table.by_tenant.items():
            if tenant not in touched and tenant in before.by_tenant:
                assert group is before.by_tenant[tenant]


def test_decision_list_makes_pending_decisions_only_when_read() -> None:
    trials = (queued(1), queued(2), queued(3))
    calls: list[int] = []

    def reason(trial: object) -> str:
        calls.append(trial.trial_id)  # type: ignore[attr-defined]
        return "busy"

    decisions = DecisionList([Start(0, ("n",))], (), [Pending(9, "x")], [(trials, 1, reason)])
    assert decisions.starts == (Start(0, ("n",)),)
    assert not calls
    assert list(decisions) == [
        Start(0, ("n",)),
        Pending(9, "x"),
        Pending(2, "busy"),
        Pending(3, "busy"),
    ]
    assert calls == [2, 3]
    assert len(decisions) == 4
    assert decisions[0] == Start(0, ("n",))
