"""SchedulingView.facts: a tick's records in, the builder's facts out, unchanged ones reused."""

from __future__ import annotations

import copy
from dataclasses import replace

from trainhub.core.resources import Node
from trainhub.core.scheduling import FifoPolicy
from trainhub.core.spec import parse_spec
from trainhub.core.states import TrialState
from trainhub.service.records import Attempt, CheckpointTimes, SchedulingRecord, TrialOwner
from trainhub.service.scheduling_view import SchedulingView

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


def test_unchanged_records_read_again_give_the_same_facts_objects() -> None:
    v = view()
    queued, running = [trial(1), trial(2)], [trial(3, TrialState.RUNNING)]
    attempts = {3: attempt(3)}
    times = {3: CheckpointTimes(3, 1, 150.0, 60.0)}
    first = v.facts(queued, running, SPECS, attempts, {}, times)
    # the next tick reads equal records as new objects
    again = v.facts(
        copy.deepcopy(queued),
        copy.deepcopy(running),
        SPECS,
        copy.deepcopy(attempts),
        {},
        copy.deepcopy(times),
    )
    assert [f.trial_id for f in again] == [1, 2, 3]
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert again[2].placement == ("n0", "n1")
    assert again[2].last_checkpoint_at == 150.0
    assert again[2].request.num_slots == 2


def test_a_changed_record_gives_new_facts_for_that_trial_only() -> None:
    v = view()
    queued, running = [trial(1), trial(2)], [trial(3, TrialState.RUNNING)]
    attempts = {3: attempt(3)}
    first = v.facts(queued, running, SPECS, attempts, {}, {})
    # trial 2's priority changes; trial 3 registers a checkpoint; trial 1 was preempted once
    later = v.facts(
        [trial(1), trial(2)._replace(priority="high")],
        [trial(3, TrialState.RUNNING)],
        SPECS,
        {3: attempt(3)},
        {1: 1},
        {3: CheckpointTimes(3, 1, 170.0, None)},
    )
    assert [a is b for a, b in zip(first, later, strict=True)] == [False, False, False]
    assert later[0].num_preemptions == 1
    assert later[1].priority.value == "high"
    assert later[2].last_checkpoint_at == 170.0
    # and a new attempt of trial 3 (it was preempted and restarted elsewhere)
    restarted = replace(attempt(3, number=2), placement=("n2", "n3"), created_at=300.0)
    after = v.facts([], [trial(3, TrialState.RUNNING)], SPECS, {3: restarted}, {}, {})
    assert after[0].placement == ("n2", "n3")
    assert after[0].attempt_started_at == 300.0


def test_a_new_pending_note_is_not_a_new_fact() -> None:
    v = view()
    first = v.facts([trial(1)], [], SPECS, {}, {}, {})
    noted = trial(1)._replace(pending_reason="waiting for 2 GPUs", queue_position=1)
    assert v.facts([noted], [], SPECS, {}, {}, {})[0] is first[0]


def test_an_active_trial_without_an_open_attempt_is_left_out() -> None:
    v = view()
    running = [trial(3, TrialState.RUNNING), trial(4, TrialState.RUNNING)]
    facts = v.facts([trial(1)], running, SPECS, {4: attempt(4)}, {}, {})
    assert [f.trial_id for f in facts] == [1, 4]
    assert facts[1].placement == ("n0", "n1")


def test_refreshed_estimates_remake_every_trials_facts() -> None:
    v = view()
    v._owners = {1: TrialOwner(1, "ann", "p")}
    first = v.facts([trial(1)], [], SPECS, {}, {}, {})
    assert first[0].expected_duration_s is None
    # the estimates' refresh (SchedulingView.snapshot) learnt three finished runs of ann in p
    v._finished = [("ann", "p", 60.0), ("ann", "p", 120.0), ("ann", "p", 180.0)]
    v._estimates, v._estimates_at = {}, 50.0
    again = v.facts([trial(1)], [], SPECS, {}, {}, {})
    assert again[0] is not first[0]
    assert again[0].expected_duration_s == 120.0


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
