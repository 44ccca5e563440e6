"""The control loop, one tick at a time: real SQLite, a fake executor, a stepped clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from tests.service.loop_harness import SIGTERM_EXIT, LoopHarness, cpu_nodes
from trainhub.core.scheduling import BasePolicy, Decision, FifoPolicy, Preempt, Snapshot
from trainhub.core.states import AttemptOutcome, ExperimentState, TrialState
from trainhub.core.verdicts import EndAttempt, RequestStop, Terminate, Wait
from trainhub.runtime import protocol
from trainhub.service.control_loop import ControlLoop, LoopConfig
from trainhub.service.keys import log_key
from trainhub.service.tracking import TrackingService

SPEC = "name: demo\nentrypoint: sleep 3600\nresources: {workers: 2, cpus_per_worker: 2}\n"


class PreemptingFifo(BasePolicy):
    """FIFO, plus a preemption the test asks for (the loop carries out any policy's)."""

    def __init__(self) -> None:
        self.fifo = FifoPolicy()
        self.preempt: list[int] = []

    def decide(self, snapshot: Snapshot) -> Sequence[Decision]:
        decisions = list(self.fifo.decide(snapshot))
        running = {r.trial_id for r in snapshot.running}
        decisions += [
            Preempt(t, "tenant x wants its guarantee") for t in self.preempt if t in running
        ]
        self.preempt = []
        return decisions


# needs the whole cluster: it waits while anything runs, so the policy has a queue to decide
WHOLE_CLUSTER = "name: big\nentrypoint: sleep 3600\nresources: {workers: 2, cpus_per_worker: 8}\n"


@pytest.fixture
def policy() -> PreemptingFifo:
    return PreemptingFifo()


@pytest.fixture
def h(tmp_path: Path, policy: PreemptingFifo) -> Iterator[LoopHarness]:
    harness = LoopHarness(tmp_path, policy, cpu_nodes(2), LoopConfig("http://127.0.0.1:1"))
    yield harness
    harness.close()


def start_running(h: LoopHarness, trial_id: int) -> str:
    report = h.tick()
    assert report.started == [trial_id]
    key = h.key(trial_id)
    h.executor.run(key)
    h.tick()
    assert h.trial(trial_id).state == TrialState.RUNNING
    return key


def test_a_trial_runs_and_completes_with_its_run_time_kept(h: LoopHarness) -> None:
    trial_id = h.submit(SPEC)
    report = h.tick()
    assert report.started == [trial_id]
    trial = h.trial(trial_id)
    assert (trial.state, trial.num_attempts) == (TrialState.SCHEDULED, 1)
    key = h.key(trial_id)
    launch = h.executor.attempts[key].launch
    assert len(launch.placement) == 2
    assert launch.cpus_per_worker == 2
    h.clock.step(5)
    h.executor.run(key)
    h.tick()
    assert h.trial(trial_id).state == TrialState.RUNNING
    h.clock.step(100)
    h.executor.exit(key, [0, 0])
    report = h.tick()
    assert isinstance(report.verdicts[trial_id], EndAttempt)
    trial = h.trial(trial_id)
    assert trial.state == TrialState.COMPLETED
    assert trial.run_time_s == pytest.approx(100.0)
    # service counts from placement (its slots were held): 105 s x 2 workers x 2 CPUs
    assert trial.attained_service == pytest.approx(105.0 * 4)
    [attempt] = h.attempts(trial_id)
    assert (attempt.outcome, attempt.exit_codes) == ("SUCCEEDED", (0, 0))
    assert h.executor.released == [key]


def test_placement_timeout_requeues_without_charging_a_restart(h: LoopHarness) -> None:
    trial_id = h.submit(SPEC)
    h.tick()
    key = h.key(trial_id)
    h.clock.step(299)
    assert isinstance(h.tick().verdicts[trial_id], Wait)
    h.clock.step(2)
    report = h.tick()
    verdict = report.verdicts[trial_id]
    assert isinstance(verdict, EndAttempt)
    assert verdict.outcome == AttemptOutcome.UNPLACED
    trial = h.trial(trial_id)
    assert trial.num_restarts == 0
    assert trial.state == TrialState.SCHEDULED  # placed again in the same tick
    assert trial.num_attempts == 2
    first = h.attempts(trial_id)[0]
    assert first.outcome == "UNPLACED"
    assert "placement not ready after 300 s (placement group pending" in (first.detail or "")
    assert trial.run_time_s == 0.0
    assert key in h.executor.released
    assert any("not a restart" in e or "unplaced" in e for e in h.events(trial_id))


def test_a_failed_launch_ends_the_attempt_at_once_with_its_cause(h: LoopHarness) -> None:
    trial_id = h.submit(SPEC)
    h.executor.launch_error = RuntimeError("runtime_env setup failed:\n  pip: no such package")
    h.tick()
    trial = h.trial(trial_id)
    assert trial.state == TrialState.QUEUED
    assert trial.message == "launch failed: runtime_env setup failed: pip: no such package"
    assert trial.num_restarts == 1
    assert "placement" not in (trial.pending_reason or "")
    assert h.attempts(trial_id)[0].outcome == "LOST"


def test_a_launch_lost_before_it_ran_says_why_not_placement(h: LoopHarness) -> None:
    trial_id = h.submit(SPEC)
    h.tick()
    key = h.key(trial_id)
    h.executor.lose(key, "rank 0 lost: actor creation failed: out of memory on node-0")
    h.tick()
    trial = h.trial(trial_id)
    assert trial.message == (
        "launch failed: rank 0 lost: actor creation failed: out of memory on node-0"
    )
    assert h.attempts(trial_id)[0].outcome == "LOST"


def test_restarts_are_counted_until_exhausted(h: LoopHarness) -> None:
    trial_id = h.submit(SPEC + "max_restarts: 1\n")
    key = start_running(h, trial_id)
    h.executor.exit(key, [0, 3])
    h.tick()  # ends attempt 1 and places attempt 2 at once
    trial = h.trial(trial_id)
    assert trial.num_restarts == 1
    assert trial.message == "rank 1 exited with code 3"
    assert h.attempts(trial_id)[0].outcome == "FAILED"
    key = h.key(trial_id)
    h.executor.run(key)
    h.tick()
    h.executor.exit(key, [7, 0])
    h.tick()
    trial = h.trial(trial_id)
    assert trial.state == TrialState.FAILED
    assert trial.message == "rank 0 exited with code 7 (no restarts left of max_restarts=1)"
    with h.uow() as repo:
        assert repo.get_experiment(trial.experiment_id).state == ExperimentState.FAILED  # type: ignore[union-attr]


def test_a_second_oom_at_the_same_point_fails_the_trial_without_more_restarts(
    h: LoopHarness,
) -> None:
    oom = "rank 1 exceeded its 1 GiB memory limit: peak 1.0 GiB"
    trial_id = h.submit(SPEC + "max_restarts: 3\n")
    key = start_running(h, trial_id)
    h.executor.exit(key, [-15, -9], details={1: oom})
    h.tick()  # the first OOM: restarted, as any failure
    trial = h.trial(trial_id)
    assert trial.num_restarts == 1
    assert trial.message == oom
    key = h.key(trial_id)
    h.executor.run(key)
    h.tick()
    h.executor.exit(key, [-15, -9], details={1: oom})
    h.tick()  # again, and no checkpoint since: it would always die there
    trial = h.trial(trial_id)
    assert trial.state == TrialState.FAILED
    assert trial.message is not None
    assert trial.message.startswith(oom)
    assert "previous attempt exceeded its memory limit at the same point" in trial.message
    assert len(h.attempts(trial_id)) == 2


def test_a_failure_says_what_the_rank_printed_last(h: LoopHarness) -> None:
    trial_id = h.submit(SPEC + "max_restarts: 0\n")
    key = start_running(h, trial_id)
    h.executor.exit(key, [0, 1], {1: b"step 3\nValueError: lr must be > 0\n\n"})
    h.tick()
    trial = h.trial(trial_id)
    assert trial.state == TrialState.FAILED
    assert trial.message == (
        "rank 1 exited with code 1; rank 1 said: ValueError: lr must be > 0"
        " (no restarts left of max_restarts=0)"
    )


def test_a_refused_spec_fails_the_trial_without_restarts(h: LoopHarness) -> None:
    trial_id = h.submit(SPEC + "max_restarts: 3\n")
    key = start_running(h, trial_id)
    said = b"trainhub.runtime.errors.SpecRefused: model.freeze: 'fc9.*' matches no layer\n"
    h.executor.exit(key, [protocol.EXIT_SPEC_REFUSED, 0], {0: said})
    h.tick()
    trial = h.trial(trial_id)
    assert (trial.state, trial.num_restarts) == (TrialState.FAILED, 0)
    assert trial.message is not None
    assert trial.message.startswith("rank 0 refused the spec (exit code 78)")
    assert "model.freeze: 'fc9.*' matches no layer" in trial.message
    assert len(h.attempts(trial_id)) == 1


def test_the_refusing_rank_is_quoted_not_the_one_stopped_after_it(h: LoopHarness) -> None:
    trial_id = h.submit(SPEC + "max_restarts: 3\n")
    key = start_running(h, trial_id)
    stopped = b"trainhub: SIGTERM received; flushing metrics and checkpoints, then exiting\n"
    said = b"trainhub.runtime.errors.SpecRefused: split_points: 'blocks.9' names no layer\n"
    h.executor.exit(key, [SIGTERM_EXIT, protocol.EXIT_SPEC_REFUSED], {0: stopped, 1: said})
    h.tick()
    trial = h.trial(trial_id)
    assert trial.message is not None
    assert trial.message.startswith("rank 1 refused the spec (exit code 78)")
    assert "rank 1 said: trainhub.runtime.errors.SpecRefused: split_points: 'blocks.9'" in (
        trial.message
    )
    assert "SIGTERM received" not in trial.message


def test_a_lost_rank_breaks_the_gang_and_the_others_are_stopped(h: LoopHarness) -> None:
    trial_id = h.submit(SPEC)
    key = start_running(h, trial_id)
    attempt = h.executor.attempts[key]
    attempt.ranks[1] = attempt.ranks[1].__class__(1, attempt.ranks[1].phase.LOST)
    h.tick()
    assert h.attempts(trial_id)[0].outcome == "LOST"
    assert (key, 10.0) in h.executor.terminated
    assert h.trial(trial_id).num_restarts == 1


def test_orphans_are_released_and_attempts_without_actors_end_lost(h: LoopHarness) -> None:
    trial_id = h.submit(SPEC)
    key = start_running(h, trial_id)
    h.executor.orphans.add("t999-a1")  # a leftover of a control plane that lost its rows
    del h.executor.attempts[key]  # and this trial's actors vanished (control plane restart)
    h.clock.step(31)  # orphans are looked for every 30 s
    h.tick()
    assert "t999-a1" in h.executor.released
    assert ("t999-a1", 0) in h.executor.terminated
    assert h.attempts(trial_id)[0].outcome == "LOST"
    assert h.trial(trial_id).num_restarts == 1


def test_preemption_asks_first_then_sigterms_with_the_spec_grace(
    h: LoopHarness, policy: PreemptingFifo
) -> None:
    trial_id = h.submit(SPEC + "preemption: {grace_s: 7}\n")
    key = start_running(h, trial_id)
    with h.uow() as repo:
        repo.add_checkpoint(trial_id, "ck", 12, 1, {}, "k", 1, h.clock())
    big = h.submit(WHOLE_CLUSTER)
    policy.preempt = [trial_id]
    h.tick()
    trial = h.trial(trial_id)
    assert trial.state == TrialState.PREEMPTING
    assert h.attempts(trial_id)[0].stop_requested_at == h.clock()
    tracking = TrackingService(h.uow, h.store, h.clock)
    assert tracking.signals(h.principal, trial_id) == (True, "tenant x wants its guarantee")
    h.clock.step(5)
    assert isinstance(h.tick().verdicts[trial_id], Wait)  # should_stop() has its turn
    assert h.executor.terminated == []
    h.clock.step(6)
    verdict = h.tick().verdicts[trial_id]
    assert verdict == Terminate(7.0, "tenant x wants its guarantee")
    assert h.executor.terminated == [(key, 7.0)]
    # the script exited on SIGTERM with -15: a preemption, not a failure
    h.tick()
    trial = h.trial(trial_id)
    assert trial.num_restarts == 0
    assert trial.message == (
        "preempted (tenant x wants its guarantee); resumes from checkpoint at step 12"
    )
    assert h.attempts(trial_id)[0].outcome == "PREEMPTED"
    assert h.attempts(trial_id)[0].exit_codes == (SIGTERM_EXIT, SIGTERM_EXIT)
    assert "preempted: attempt 1: tenant x wants its guarantee" in h.events(trial_id)
    # back in the queue, and first again by submission (FIFO): placed again at once,
    # restoring the checkpoint it saved
    assert trial.state == TrialState.SCHEDULED
    assert h.attempts(trial_id)[1].restored_checkpoint_id is not None
    assert h.trial(big).state == TrialState.QUEUED


def test_a_script_that_stops_on_should_stop_is_requeued_with_its_reason(
    h: LoopHarness, policy: PreemptingFifo
) -> None:
    first = h.submit(SPEC)
    key = start_running(h, first)
    h.submit(WHOLE_CLUSTER)
    policy.preempt = [first]
    h.tick()
    h.executor.exit(key, [0, 0])  # the runtime saw should_stop(), saved and exited
    h.tick()
    trial = h.trial(first)
    reason = "preempted (tenant x wants its guarantee); resumes from the beginning"
    assert trial.message == reason
    assert trial.num_restarts == 0
    assert h.executor.terminated == []  # it stopped by itself: no SIGTERM
    assert h.attempts(first)[0].outcome == "PREEMPTED"


def test_a_script_that_ignores_sigterm_is_ended_after_the_grace(
    h: LoopHarness, policy: PreemptingFifo
) -> None:
    trial_id = h.submit(SPEC + "preemption: {grace_s: 20}\n")
    key = start_running(h, trial_id)
    h.executor.attempts[key].obeys_sigterm = False
    h.submit(WHOLE_CLUSTER)
    policy.preempt = [trial_id]
    h.tick()
    h.clock.step(10)
    assert isinstance(h.tick().verdicts[trial_id], Terminate)
    h.clock.step(20 + 30)  # grace, then the margin for the executor to report the kill
    assert isinstance(h.tick().verdicts[trial_id], Wait)
    h.clock.step(1)
    verdict = h.tick().verdicts[trial_id]
    assert isinstance(verdict, EndAttempt)
    assert verdict.outcome == AttemptOutcome.PREEMPTED
    assert key in h.executor.released
    assert h.trial(trial_id).num_restarts == 0


def test_cancel_of_a_running_trial_stops_it_gracefully(h: LoopHarness) -> None:
    trial_id = h.submit(SPEC + "preemption: {grace_s: 120}\n")
    key = start_running(h, trial_id)
    h.experiments.cancel_trial(h.principal, trial_id)
    assert isinstance(h.tick().verdicts[trial_id], RequestStop)
    h.clock.step(10)
    verdict = h.tick().verdicts[trial_id]
    assert verdict == Terminate(10.0, "canceled by admin")  # a cancel waits at most 10 s
    h.tick()
    trial = h.trial(trial_id)
    assert (trial.state, trial.message) == (TrialState.CANCELED, "canceled by admin")
    assert h.attempts(trial_id)[0].outcome == "KILLED"
    assert key in h.executor.released


class Recording(BasePolicy):
    """FIFO that keeps the snapshots it was shown."""

    def __init__(self) -> None:
        self.fifo = FifoPolicy()
        self.snapshots: list[Snapshot] = []

    def decide(self, snapshot: Snapshot) -> Sequence[Decision]:
        self.snapshots.append(snapshot)
        return self.fifo.decide(snapshot)


def test_the_policy_sees_the_facts_production_keeps(tmp_path: Path) -> None:
    policy = Recording()
    config = LoopConfig("http://127.0.0.1:1", estimate_min_samples=1)
    h = LoopHarness(tmp_path, policy, cpu_nodes(2), config)
    try:
        done = h.submit(SPEC)
        key = start_running(h, done)
        h.clock.step(600)
        h.executor.exit(key, [0, 0])
        h.tick()  # completed after 600 s of run time: the estimate for admin's 'default'
        running = h.submit(SPEC + "preemption: {preemptible: false}\n")
        key = start_running(h, running)
        with h.uow() as repo:  # the runtime registers checkpoints every 100 s
            for step in (1, 2):
                h.clock.step(100)
                repo.add_checkpoint(running, f"c{step}", step, 1, {}, "k", 1, h.clock())
        h.clock.step(30)
        h.submit(WHOLE_CLUSTER)
        h.tick()
        snapshot = policy.snapshots[-1]
        [view] = snapshot.running
        assert view.trial_id == running
        assert (view.user, view.preemptible) == ("admin", False)
        assert view.last_checkpoint_at == h.clock() - 30
        assert view.checkpoint_every_s == pytest.approx(100.0)
        assert view.work_at_risk_s(snapshot.now) == pytest.approx(30.0)
        assert view.expected_duration_s == pytest.approx(600.0)
        [waiting] = snapshot.queue
        assert waiting.user == "admin"
        assert waiting.expected_duration_s == pytest.approx(600.0)
        # free capacity by the books: 16 CPUs less the running trial's 2 x 2
        assert sum(n.free_cpus for n in snapshot.nodes) == pytest.approx(12.0)
    finally:
        h.close()


class CancelWhileDeciding(BasePolicy):
    """FIFO, while a user cancels a trial between the tick's read and the decision's start."""

    def __init__(self) -> None:
        self.fifo = FifoPolicy()
        self.cancel: Callable[[], None] | None = None

    def decide(self, snapshot: Snapshot) -> Sequence[Decision]:
        if self.cancel is not None:
            self.cancel()
        return self.fifo.decide(snapshot)


def test_a_trial_canceled_while_the_loop_decides_is_not_started(tmp_path: Path) -> None:
    policy = CancelWhileDeciding()
    h = LoopHarness(tmp_path, policy, cpu_nodes(2))
    try:
        gone = h.submit(SPEC)
        kept = h.submit(SPEC)
        policy.cancel = lambda: h.experiments.cancel_trial(h.principal, gone) and None
        report = h.tick()
        assert report.started == [kept]
        assert h.trial(gone).state == TrialState.CANCELED
        assert h.attempts(gone) == []
        assert [a.launch.trial_id for a in h.executor.attempts.values()] == [kept]
    finally:
        h.close()


def test_a_change_written_around_the_repository_shows_at_the_next_resync(
    h: LoopHarness,
) -> None:
    """A tick reads the trials whose changes were numbered since the last one (ADR 0024); a
    change written in SQL by hand is numbered by nobody, and the queue shows it once the loop
    reads every trial again (``resync_s``)."""
    running = h.submit(WHOLE_CLUSTER)
    start_running(h, running)
    first, second = h.submit(WHOLE_CLUSTER), h.submit(WHOLE_CLUSTER)
    h.tick()
    assert (h.trial(first).queue_position, h.trial(second).queue_position) == (1, 2)
    with h.uow() as repo:  # an admin's hand-written SQL: no change number
        repo.s.execute(text("UPDATE trials SET state = 'CANCELED' WHERE id = :i"), {"i": first})
    h.clock.step(1)
    h.tick()
    assert h.trial(second).queue_position == 2  # not seen yet
    h.clock.step(h.loop.view.resync_s)
    h.tick()
    assert h.trial(second).queue_position == 1
    # a change made through the repository is seen at the next tick
    h.experiments.cancel_trial(h.principal, second)
    third = h.submit(WHOLE_CLUSTER)
    h.clock.step(1)
    h.tick()
    assert h.trial(third).queue_position == 1


def test_ends_are_written_together_and_released_only_once_written(
    h: LoopHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick's ends are one transaction; the actors are released after it commits. If it
    fails (here: the database refuses the second end), no attempt is released and nothing of
    the first end is kept: the next tick finds both as they were and ends them."""
    first = h.submit(SPEC)
    first_key = start_running(h, first)
    second = h.submit(SPEC)
    second_key = start_running(h, second)
    h.executor.exit(first_key, [0, 0], {0: b"first done\n"})
    h.executor.exit(second_key, [0, 0])
    write_end = ControlLoop._write_end
    calls: list[int] = []

    def refuse_the_second(self: ControlLoop, repo: Any, ending: Any, now: float) -> None:
        calls.append(ending.trial_id)
        if len(calls) == 2:
            raise OperationalError("UPDATE trials", {}, Exception("disk I/O error"))
        write_end(self, repo, ending, now)

    monkeypatch.setattr(ControlLoop, "_write_end", refuse_the_second)
    with pytest.raises(OperationalError):
        h.tick()
    assert h.executor.released == []
    assert [a.outcome for a in h.attempts(first)] == [None]  # rolled back with the second
    monkeypatch.setattr(ControlLoop, "_write_end", write_end)
    h.clock.step(1)
    report = h.tick()
    assert sorted(report.ended) == [first, second]
    assert (h.trial(first).state, h.trial(second).state) == (TrialState.COMPLETED,) * 2
    assert sorted(h.executor.released) == sorted([first_key, second_key])
    # the output was stored once, before the failed write
    log = h.store.get(log_key(h.trial(first).tenant, first, 1, 0))
    assert log.count(b"first done") == 1


def test_attempts_are_judged_from_the_changes_and_every_resync(h: LoopHarness) -> None:
    """The loop keeps the active trials and their open attempts between ticks and reads the
    ones whose changes were numbered (ADR 0025): a cancel through the service is judged at the
    next tick; one written in SQL by hand, once the loop reads every active trial again."""
    by_hand = h.submit(SPEC)
    start_running(h, by_hand)
    by_api = h.submit(SPEC)
    start_running(h, by_api)
    with h.uow() as repo:  # an admin's hand-written SQL: no change number
        repo.s.execute(
            text(
                "UPDATE trials SET cancel_requested = TRUE, stop_reason = 'by hand' WHERE id = :i"
            ),
            {"i": by_hand},
        )
    h.experiments.cancel_trial(h.principal, by_api)
    h.clock.step(1)
    report = h.tick()
    assert report.polled == 2
    assert isinstance(report.verdicts[by_api], RequestStop)
    assert isinstance(report.verdicts[by_hand], Wait)  # not seen yet
    h.clock.step(h.loop.observed.resync_s)
    assert h.tick().verdicts[by_hand] == RequestStop("by hand")


def test_each_ranks_output_is_stored_once_in_order_across_ticks_and_a_restart(
    h: LoopHarness,
) -> None:
    """The loop counts the bytes of each rank's log it stored and asks the executor for what
    follows; a new loop (a restarted server) asks the store once per attempt."""
    trial_id = h.submit(SPEC)
    key = start_running(h, trial_id)
    h.executor.say(key, {0: b"epoch 0\n", 1: b"rank 1 up\n"})
    h.tick()
    h.executor.say(key, {0: b"epoch 1\n"})
    h.tick()
    h.tick()  # nothing new
    assert h.executor.offsets_asked[-1] == {0: 16, 1: 10}
    # the server restarts: a new control loop on the same database and store
    h.loop = ControlLoop(h.uow, h.executor, h.store, h.loop.policy, h.loop.config, h.clock)
    h.executor.say(key, {0: b"epoch 2\n"})
    h.tick()
    h.executor.exit(key, [0, 0], {0: b"done\n", 1: b"bye\n"})
    h.tick()
    assert h.trial(trial_id).state == TrialState.COMPLETED
    tenant = h.trial(trial_id).tenant
    logs = [h.store.get(log_key(tenant, trial_id, 1, rank)) for rank in (0, 1)]
    assert logs == [b"epoch 0\nepoch 1\nepoch 2\ndone\n", b"rank 1 up\nbye\n"]
