"""SchedulingView.apply: a tick's changed records in, the builder's facts out, unchanged ones
reused (ADR 0023, 0024)."""

from __future__ import annotations

import copy
from dataclasses import replace

from trainhub.core.resources import Node
from trainhub.core.scheduling import FifoPolicy, ShortestJobFirstPolicy
from trainhub.core.scheduling.view import TrialFacts
from trainhub.core.spec import parse_spec
from trainhub.core.states import TrialState
from trainhub.service.records import Attempt, CheckpointTimes, SchedulingRecord, TrialOwner
from trainhub.service.scheduling_view import SchedulingView, TrialReads

SPECS = {
    1: parse_spec(
        "name: job\nentrypoint: train.py\n"
        "resources: {workers: 2, gpus_per_worker: 1, cpus_per_worker: 1}\n"
    )
}


def trial(trial_id: int, state: TrialState = TrialState.QUEUED) -> SchedulingRecord:
    """A trial's scheduling columns, as the repository reads them."""
    return SchedulingRecord(
        id=trial_id,
        experiment_id=1,
        tenant="a",
        state=state,
        priority="normal",
        submitted_at=float(trial_id),
        queued_at=float(trial_id),
        attained_service=0.0,
        progress_s=0.0,
        pending_reason=None,
        queue_position=None,
    )


def attempt(trial_id: int, number: int = 1) -> Attempt:
    return Attempt(
        id=10 * trial_id + number,
        trial_id=trial_id,
        number=number,
        key=f"k{trial_id}-{number}",
        placement=("n0", "n1"),
        restored_checkpoint_id=None,
        token_id=None,
        outcome=None,
        exit_codes=(),
        detail=None,
        created_at=100.0,
        started_at=101.0,
        ended_at=None,
        num_slots=2,
    )


def view() -> SchedulingView:
    return SchedulingView(FifoPolicy(), half_life_s=3600.0)


def apply(
    v: SchedulingView,
    records: list[SchedulingRecord],
    attempts: dict[int, Attempt] | None = None,
    preemptions: dict[int, int] | None = None,
    checkpoints: dict[int, CheckpointTimes] | None = None,
    *,
    whole: bool = False,
) -> dict[int, TrialFacts]:
    """One tick's read applied; the facts the builder holds afterwards."""
    reads = TrialReads(
        records,
        whole,
        mark=0,
        attempts=attempts or {},
        preemptions=preemptions or {},
        checkpoints=checkpoints or {},
    )
    v.apply(reads, SPECS, now=0.0)
    return dict(v.builder.facts)


def test_unchanged_records_read_again_give_the_same_facts_objects() -> None:
    v = view()
    records = [trial(1), trial(2), trial(3, TrialState.RUNNING)]
    attempts = {3: attempt(3)}
    times = {3: CheckpointTimes(3, 1, 150.0, 60.0)}
    first = apply(v, records, attempts, {}, times, whole=True)
    # a resync reads equal records as new objects
    again = apply(
        v, copy.deepcopy(records), copy.deepcopy(attempts), {}, copy.deepcopy(times), whole=True
    )
    assert sorted(again) == [1, 2, 3]
    assert all(again[i] is first[i] for i in first)
    assert again[3].placement == ("n0", "n1")
    assert again[3].last_checkpoint_at == 150.0
    assert again[3].request.num_slots == 2


def test_a_changed_record_gives_new_facts_for_that_trial_only() -> None:
    v = view()
    first = apply(
        v, [trial(1), trial(2), trial(3, TrialState.RUNNING)], {3: attempt(3)}, whole=True
    )
    # trial 2's priority changes; trial 3 registers a checkpoint; trial 1 was preempted once
    later = apply(v, [trial(1)], {}, {1: 1})
    later = apply(v, [trial(2)._replace(priority="high")])
    later = apply(
        v,
        [trial(3, TrialState.RUNNING)],
        {3: attempt(3)},
        {},
        {3: CheckpointTimes(3, 1, 170.0, None)},
    )
    assert [later[i] is first[i] for i in (1, 2, 3)] == [False, False, False]
    assert later[1].num_preemptions == 1
    assert later[2].priority.value == "high"
    assert later[3].last_checkpoint_at == 170.0
    # and a new attempt of trial 3 (it was preempted and restarted elsewhere); 1 and 2 stay
    restarted = replace(attempt(3, number=2), placement=("n2", "n3"), created_at=300.0)
    after = apply(v, [trial(3, TrialState.RUNNING)], {3: restarted})
    assert after[3].placement == ("n2", "n3")
    assert after[3].attempt_started_at == 300.0
    assert after[1] is later[1]
    assert after[2] is later[2]


def test_a_new_pending_note_is_not_a_new_fact() -> None:
    v = view()
    first = apply(v, [trial(1)], whole=True)
    noted = trial(1)._replace(pending_reason="waiting for 2 GPUs", queue_position=1)
    assert apply(v, [noted], whole=True)[1] is first[1]
    assert v.records[1].pending_reason == "waiting for 2 GPUs"


def test_trials_that_left_the_queue_or_ended_leave_the_snapshot() -> None:
    v = view()
    apply(v, [trial(1), trial(2), trial(3, TrialState.RUNNING)], {3: attempt(3)}, whole=True)
    # trial 1 was canceled, trial 3 completed: read in their new states
    after = apply(v, [trial(1, TrialState.CANCELED), trial(3, TrialState.COMPLETED)])
    assert sorted(after) == [2]
    assert sorted(v.records) == [2]
    # a resync that no longer lists trial 2 (changed around the repository) forgets it too
    assert apply(v, [], whole=True) == {}
    assert v.records == {}


def test_an_active_trial_without_an_open_attempt_is_left_out_until_one_is_read() -> None:
    v = view()
    running = [trial(3, TrialState.RUNNING), trial(4, TrialState.RUNNING)]
    facts = apply(v, [trial(1), *running], {4: attempt(4)}, whole=True)
    assert sorted(facts) == [1, 4]
    assert facts[4].placement == ("n0", "n1")
    assert sorted(v.records) == [1, 3, 4]  # known, not in the snapshot
    # its attempt was added (which numbers the trial as changed)
    assert sorted(apply(v, [trial(3, TrialState.RUNNING)], {3: attempt(3)})) == [1, 3, 4]


def test_refreshed_estimates_remake_the_facts_whose_estimate_changed() -> None:
    v = SchedulingView(ShortestJobFirstPolicy(), half_life_s=3600.0)  # it reads them
    v._owners = {1: TrialOwner(1, "ann", "p"), 2: TrialOwner(2, "bob", "q")}
    first = apply(v, [trial(1), trial(2)], whole=True)
    assert first[1].expected_duration_s is None
    # the estimates' refresh (SchedulingView.read) learnt three finished runs of ann in p
    v._finished = [("ann", "p", 60.0), ("ann", "p", 120.0), ("ann", "p", 180.0)]
    v._estimates_at = 50.0
    again = apply(v, [])
    assert again[1] is not first[1]
    assert again[1].expected_duration_s == 120.0
    assert again[2] is first[2]  # bob's estimate did not change
    # and a trial read afterwards keeps the new facts (its key did not change)
    assert apply(v, [trial(1)])[1] is again[1]


def test_a_refresh_remakes_only_the_facts_whose_estimates_the_policy_reads() -> None:
    """FIFO reads no durations: its queued trials keep their facts at a refresh; SJF reads the
    queued trials' (and the simulator remakes the same ones, ``sim.estimates``)."""
    for policy, remade in ((FifoPolicy(), False), (ShortestJobFirstPolicy(), True)):
        v = SchedulingView(policy, half_life_s=3600.0)
        v._owners = {1: TrialOwner(1, "ann", "p")}
        first = apply(v, [trial(1)], whole=True)
        v._finished = [("ann", "p", 60.0), ("ann", "p", 120.0), ("ann", "p", 180.0)]
        v._estimates_at = 50.0
        again = apply(v, [])
        assert (again[1] is not first[1]) is remade
        assert again[1].expected_duration_s == (120.0 if remade else None)
        # once its facts are made again for another reason, the estimate is read afresh
        started = apply(v, [trial(1, TrialState.RUNNING)], {1: attempt(1)})
        assert started[1].expected_duration_s == 120.0


def test_nodes_listed_again_keep_their_facts_until_listing_or_monitor_changes() -> None:
    v = view()
    nodes = [Node("n0", 8, 64.0, 8, 64.0), Node("n1", 8, 64.0, 2, 64.0)]
    first = v.node_facts(nodes)
    # listed again by the executor (new objects, other free counts: the builder counts those)
    again = v.node_facts([replace(n, free_gpus=0) for n in nodes])
    assert all(a is b for a, b in zip(first, again, strict=True))
    hot = v.node_facts(nodes, {"n1": (False, 91.0)})
    assert hot[0] is first[0]
    assert hot[1] is not first[1]
    assert (hot[1].alive, hot[1].gpu_temperature_c) == (False, 91.0)
