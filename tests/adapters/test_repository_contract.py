"""The repository contract, run against SQLite and PostgreSQL alike."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import update as sa_update
from sqlalchemy.orm import sessionmaker

from trainhub.adapters.db import SqlUnitOfWork, changes, make_engine, migrate
from trainhub.adapters.db.models import TrialRow
from trainhub.core.errors import Conflict, IllegalTransition
from trainhub.core.states import ExperimentState, TrialState
from trainhub.service.records import AttemptUpdate, TenantUpdate, TrialUpdate
from trainhub.service.trial_writes import write_trial


@pytest.fixture
def uow(db_url: str) -> Iterator[SqlUnitOfWork]:
    engine = make_engine(db_url)
    migrate(engine)
    migrate(engine)  # applying migrations twice is a no-op
    yield SqlUnitOfWork(engine)
    engine.dispose()


def seed(uow: SqlUnitOfWork) -> tuple[int, int]:
    with uow() as repo:
        repo.add_tenant("vision", 1.0)
        user = repo.add_user("alice", False, 1.0)
        repo.set_membership(user.id, "vision", "member")
        experiment = repo.add_experiment("vision", user.id, "e", "p", {"a": 1}, "a: 1", 0, 2.0)
        trial = repo.add_trial(experiment.id, {"lr": 0.1}, "normal", 2.0)
        return experiment.id, trial.id


def test_users_tenants_memberships(uow: SqlUnitOfWork) -> None:
    seed(uow)
    with uow() as repo:
        user = repo.get_user_by_name("alice")
        assert user is not None
        assert user.roles == {"vision": "member"}
        repo.set_membership(user.id, "vision", "viewer")
        assert repo.get_user(user.id).roles == {"vision": "viewer"}  # type: ignore[union-attr]
        with pytest.raises(Conflict):
            repo.add_user("alice", False, 3.0)


def test_a_failed_unit_of_work_rolls_back(uow: SqlUnitOfWork) -> None:
    def fail() -> None:
        with uow() as repo:
            repo.add_tenant("ghost", 1.0)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        fail()
    with uow() as repo:
        assert repo.get_tenant("ghost") is None


def test_trial_state_changes_are_checked(uow: SqlUnitOfWork) -> None:
    experiment_id, trial_id = seed(uow)
    with uow() as repo, pytest.raises(IllegalTransition):
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.RUNNING))
    with uow() as repo:
        write_trial(repo, trial_id, TrialUpdate(state=TrialState.SCHEDULED, num_attempts=1))
        trial = write_trial(repo, trial_id, TrialUpdate(state=TrialState.RUNNING, started_at=5.0))
        assert trial.state == TrialState.RUNNING
        assert trial.started_at == 5.0
        assert trial.num_attempts == 1
        assert [t.id for t in repo.trials_in_states([TrialState.RUNNING])] == [trial_id]
        # compare and set: a write that expects a state the row has left is refused
        with pytest.raises(Conflict, match="not SCHEDULED"):
            repo.update_trial(
                trial_id,
                TrialUpdate(state=TrialState.QUEUED),
                expected_state=TrialState.SCHEDULED,
            )
        # KEEP leaves a column alone; None writes NULL
        trial = repo.update_trial(trial_id, TrialUpdate(pending_reason=None, message="m"))
        assert (trial.state, trial.started_at, trial.message) == (TrialState.RUNNING, 5.0, "m")
        assert TrialUpdate(message=None).changes() == {"message": None}
        repo.set_experiment_state(experiment_id, ExperimentState.COMPLETED, 9.0)
        rows, count = repo.list_experiments(["vision"], ExperimentState.COMPLETED)
        assert count == 1
        assert rows[0].trial_ids == (trial_id,)
        assert repo.list_experiments(["other"])[1] == 0


def test_attempts(uow: SqlUnitOfWork) -> None:
    _, trial_id = seed(uow)
    with uow() as repo:
        first = repo.add_attempt(trial_id, 1, "t1-a1", ["n1", "n2"], None, None, 3.0)
        assert repo.open_attempt(trial_id) == first
        repo.update_attempt(
            first.id, AttemptUpdate(outcome="FAILED", exit_codes=(1, None), ended_at=4.0)
        )
        assert repo.open_attempt(trial_id) is None
        repo.add_attempt(trial_id, 2, "t1-a2", ["n1"], 7, None, 5.0)
        attempts = repo.list_attempts(trial_id)
        assert [a.number for a in attempts] == [1, 2]
        assert repo.open_attempts([trial_id, trial_id + 1000]) == {trial_id: attempts[1]}
        assert repo.open_attempts([]) == {}
        assert attempts[0].exit_codes == (1, None)
        assert attempts[1].restored_checkpoint_id == 7


def test_metrics_merge_within_an_attempt_and_replace_across(uow: SqlUnitOfWork) -> None:
    _, trial_id = seed(uow)
    with uow() as repo:
        repo.upsert_metrics(trial_id, 1, [(0, {"loss": 1.0}), (1, {"loss": 0.5})], 3.0)
        repo.upsert_metrics(trial_id, 1, [(1, {"acc": 0.7})], 3.5)
        repo.upsert_metrics(trial_id, 2, [(1, {"loss": 0.4})], 4.0)
        points = repo.list_metrics(trial_id)
        assert [(p.step, p.attempt, p.values) for p in points] == [
            (0, 1, {"loss": 1.0}),
            (1, 2, {"loss": 0.4}),
        ]
        assert [p.step for p in repo.list_metrics(trial_id, after_step=0)] == [1]


def test_a_metrics_batch_is_one_upsert_retries_change_nothing(uow: SqlUnitOfWork) -> None:
    _, trial_id = seed(uow)
    batch = [(step, {"loss": 1.0 / (step + 1), "epoch": step // 10}) for step in range(1500)]
    batch.append((3, {"acc": 0.25}))  # a step twice in one batch merges
    with uow() as repo:
        repo.upsert_metrics(trial_id, 1, batch, 3.0)
    with uow() as repo:  # the runtime retries a batch whose answer it lost
        repo.upsert_metrics(trial_id, 1, batch, 4.0)
        points = repo.list_metrics(trial_id)
    assert [p.step for p in points] == list(range(1500))
    assert points[3].values == {"loss": 0.25, "epoch": 0, "acc": 0.25}
    assert points[1499].values == {"loss": 1.0 / 1500, "epoch": 149}
    assert {p.reported_at for p in points} == {4.0}
    with uow() as repo:  # the next attempt's report of step 3 replaces the values, not merges
        repo.upsert_metrics(trial_id, 2, [(3, {"loss": 0.5})], 5.0)
        replaced = repo.list_metrics(trial_id, after_step=2, limit=1)
    assert [(p.step, p.attempt, p.values) for p in replaced] == [(3, 2, {"loss": 0.5})]


def test_metrics_target_reads_what_a_batch_is_checked_against(uow: SqlUnitOfWork) -> None:
    experiment_id, trial_id = seed(uow)
    with uow() as repo:
        target = repo.metrics_target(trial_id, 1)
        assert target is not None
        assert (target.trial_id, target.experiment_id, target.tenant) == (
            trial_id,
            experiment_id,
            "vision",
        )
        assert (target.state, target.latest_metrics, target.has_attempt) == (
            TrialState.QUEUED,
            {},
            False,
        )
        assert target.searcher is None  # the spec has no searcher section
        repo.add_attempt(trial_id, 1, "t1-a1", ["n1"], None, None, 3.0)
        repo.update_trials([(trial_id, TrialUpdate(latest_metrics={"loss": 0.5, "step": 3}))])
        owner = repo.get_user_by_name("alice")
        assert owner is not None
        searcher = {"metric": "loss", "mode": "min"}
        searched = repo.add_experiment(
            "vision", owner.id, "s", "p", {"searcher": searcher}, "", 0, 2.0
        )
        other = repo.add_trial(searched.id, {}, "normal", 2.0)
    with uow() as repo:
        target = repo.metrics_target(trial_id, 1)
        second = repo.metrics_target(trial_id, 2)
        assert target is not None
        assert second is not None
        assert target.has_attempt
        assert not second.has_attempt
        assert target.latest_metrics == {"loss": 0.5, "step": 3}
        searched_target = repo.metrics_target(other.id, 1)
        assert searched_target is not None
        assert searched_target.searcher == {"metric": "loss", "mode": "min"}
        assert repo.metrics_target(other.id + 1000, 1) is None


def test_checkpoints(uow: SqlUnitOfWork) -> None:
    _, trial_id = seed(uow)
    with uow() as repo:
        a = repo.add_checkpoint(trial_id, "u1", 1, 1, {"acc": 0.5}, "k1", 10, 3.0)
        repo.add_checkpoint(trial_id, "u2", 2, 1, {}, "k2", 10, 4.0)
        assert repo.get_checkpoint_by_uuid("u1") == a
        repo.mark_checkpoint_deleted(a.id)
        assert repo.get_checkpoint(a.id) is None
        assert [c.uuid for c in repo.list_checkpoints(trial_id)] == ["u2"]
    with pytest.raises(Conflict), uow() as repo:
        repo.add_checkpoint(trial_id, "u2", 2, 1, {}, "k2", 10, 4.0)


def test_tokens_and_events(uow: SqlUnitOfWork) -> None:
    _, trial_id = seed(uow)
    with uow() as repo:
        token = repo.add_token("h" * 64, "th_x", "n", 1.0, trial_id=trial_id, expires_at=9.0)
        assert repo.find_token("h" * 64) == token
        repo.revoke_token(token.id)
        assert repo.find_token("h" * 64).revoked  # type: ignore[union-attr]
        for i in range(3):
            repo.add_event(trial_id, "k", f"m{i}", float(i))
        assert [e.message for e in repo.list_events(trial_id, limit=2)] == ["m1", "m2"]


def test_tenant_updates_are_typed(uow: SqlUnitOfWork) -> None:
    seed(uow)
    with uow() as repo:
        tenant = repo.update_tenant("vision", TenantUpdate(guaranteed_slots=4, limit_slots=8))
        assert (tenant.guaranteed_slots, tenant.limit_slots, tenant.weight) == (4, 8, 1.0)
        tenant = repo.update_tenant("vision", TenantUpdate(limit_slots=None))
        assert (tenant.guaranteed_slots, tenant.limit_slots) == (4, None)
    with pytest.raises(TypeError):
        TenantUpdate(guaranteed=4)  # type: ignore[call-arg]


def test_scheduler_facts(uow: SqlUnitOfWork) -> None:
    """Checkpoint times, owners and run times of completed trials: what the scheduler reads."""
    experiment_id, trial_id = seed(uow)
    with uow() as repo:
        other = repo.add_trial(experiment_id, {}, "normal", 2.0).id
        # attempt 1 checkpoints every 10 s; attempt 2 made one so far (deleted ones count)
        for uuid, attempt, at in (("c1", 1, 10.0), ("c2", 1, 20.0), ("c3", 1, 30.0)):
            repo.add_checkpoint(trial_id, uuid, int(at), attempt, {}, uuid, 1, at)
        latest = repo.add_checkpoint(trial_id, "c4", 40, 2, {}, "c4", 1, 45.0)
        repo.mark_checkpoint_deleted(latest.id)
        times = repo.checkpoint_times([trial_id, other])
        assert list(times) == [trial_id]
        assert (times[trial_id].attempt, times[trial_id].last_at) == (2, 45.0)
        assert times[trial_id].interval_s == pytest.approx(10.0)
        owners = repo.trial_owners([trial_id, other, 10_000])
        assert {o.trial_id: (o.user, o.project) for o in owners.values()} == {
            trial_id: ("alice", "p"),
            other: ("alice", "p"),
        }
        for tid, run_time in ((trial_id, 100.0), (other, 300.0)):
            write_trial(repo, tid, TrialUpdate(state=TrialState.SCHEDULED))
            write_trial(repo, tid, TrialUpdate(state=TrialState.COMPLETED, run_time_s=run_time))
        runs = repo.finished_runs()
        assert sorted((r.user, r.project, r.run_time_s) for r in runs) == [
            ("alice", "p", 100.0),
            ("alice", "p", 300.0),
        ]
        assert len(repo.finished_runs(limit=1)) == 1


def test_batch_reads_and_writes_of_the_control_loop(uow: SqlUnitOfWork) -> None:
    experiment_id, trial_id = seed(uow)
    with uow() as repo:
        assert repo.experiment_specs([experiment_id, 10_000]) == {experiment_id: {"a": 1}}
        assert repo.context_key(experiment_id) is None  # no code stored yet
        repo.set_experiment_context(experiment_id, "tenants/vision/contexts/1.tar.gz")
        assert repo.context_key(experiment_id) == "tenants/vision/contexts/1.tar.gz"
        assert repo.context_key(10_000) is None
        repo.update_trials([(trial_id, TrialUpdate(pending_reason="r", queue_position=3))])
        with pytest.raises(ValueError, match="no state"):
            repo.update_trials([(trial_id, TrialUpdate(state=TrialState.SCHEDULED))])
    with uow() as repo:
        trial = repo.get_trial(trial_id)
        assert trial is not None
        assert (trial.pending_reason, trial.queue_position, trial.state) == (
            "r",
            3,
            TrialState.QUEUED,
        )


def test_a_batch_of_updates_writes_each_row_its_own_columns(uow: SqlUnitOfWork) -> None:
    """A tick's pending notes are one batch (one statement per set of columns): each row gets
    its own values, a JSON column too, and a read in the same session after the batch shows
    the write."""
    experiment_id, first = seed(uow)
    with uow() as repo:
        others = [repo.add_trial(experiment_id, {}, "normal", 3.0).id for _ in range(3)]
        held = repo.get_trial(first)  # read before the batch, in the same session
        assert held is not None
        assert held.queue_position is None
        repo.update_trials(
            [
                (first, TrialUpdate(pending_reason="first", queue_position=1)),
                *(
                    (trial_id, TrialUpdate(pending_reason=f"#{n}", queue_position=n))
                    for n, trial_id in enumerate(others, start=2)
                ),
                (others[0], TrialUpdate(latest_metrics={"loss": 0.25})),
            ]
        )
        again = repo.get_trial(first)
        assert again is not None
        assert again.queue_position == 1
    with uow() as repo:
        trials = {t: repo.get_trial(t) for t in (first, *others)}
    assert {t: (r.pending_reason, r.queue_position) for t, r in trials.items() if r} == {
        first: ("first", 1),
        others[0]: ("#2", 2),
        others[1]: ("#3", 3),
        others[2]: ("#4", 4),
    }
    assert trials[others[0]].latest_metrics == {"loss": 0.25}  # type: ignore[union-attr]
    assert trials[others[1]].latest_metrics == {}  # type: ignore[union-attr]


def test_trial_demand_lists_the_trials_that_waited_or_ran_after_a_time(
    uow: SqlUnitOfWork,
) -> None:
    seed(uow)
    with uow() as repo:
        user = repo.get_user_by_name("alice")
        assert user is not None
        spec = {"resources": {"workers": 2, "gpus_per_worker": 4}}
        experiment = repo.add_experiment("vision", user.id, "wide", "p", spec, "", 0, 3.0)
        done = repo.add_trial(experiment.id, {}, "normal", 3.0).id
        repo.add_trial(experiment.id, {}, "normal", 3.0)  # still waiting
        write_trial(repo, done, TrialUpdate(state=TrialState.SCHEDULED))
        write_trial(repo, done, TrialUpdate(state=TrialState.COMPLETED, ended_at=50.0))
        recent = {(d.tenant, d.slots, d.start, d.end) for d in repo.trial_demand(100.0)}
        everything = {(d.tenant, d.slots, d.start, d.end) for d in repo.trial_demand(10.0)}
    assert ("vision", 8, 3.0, None) in recent
    assert ("vision", 8, 3.0, 50.0) not in recent
    assert ("vision", 8, 3.0, 50.0) in everything
    assert len(everything) == len(recent) + 1 == 3  # the seed's trial waits too


def test_scheduling_records_hold_the_whole_trials_scheduling_columns(
    uow: SqlUnitOfWork,
) -> None:
    experiment_id, first = seed(uow)
    with uow() as repo:
        second = repo.add_trial(experiment_id, {"lr": 0.2}, "high", 3.0).id
        repo.add_trial(experiment_id, {"lr": 0.3}, "normal", 4.0)
        write_trial(repo, second, TrialUpdate(state=TrialState.SCHEDULED))
        write_trial(repo, second, TrialUpdate(state=TrialState.RUNNING, attained_service=7.5))
        repo.update_trial(first, TrialUpdate(pending_reason="waiting", queue_position=1))
        queued = repo.scheduling_records([TrialState.QUEUED])
        running = repo.scheduling_records([TrialState.RUNNING, TrialState.SCHEDULED])
        whole = {t.id: t for t in repo.trials_in_states(list(TrialState))}
    assert [r.id for r in queued] == [first, second + 1]
    assert [r.id for r in running] == [second]
    for record in (*queued, *running):
        trial = whole[record.id]
        assert record == (
            trial.id,
            trial.experiment_id,
            trial.tenant,
            trial.state,
            trial.priority,
            trial.submitted_at,
            trial.queued_at,
            trial.attained_service,
            trial.progress_s,
            trial.pending_reason,
            trial.queue_position,
        )
    assert running[0].state is TrialState.RUNNING
    assert (running[0].priority, running[0].attained_service) == ("high", 7.5)
    assert (queued[0].pending_reason, queued[0].queue_position) == ("waiting", 1)


def test_scheduling_changes_are_what_the_scheduler_reads_numbered_at_commit(
    uow: SqlUnitOfWork,
) -> None:
    experiment_id, first = seed(uow)
    with uow() as repo:
        whole = repo.scheduling_changes(None)
    assert whole.whole
    assert [r.id for r in whole.records] == [first]
    mark = whole.mark

    def changed() -> list[int]:
        nonlocal mark
        with uow() as repo:
            read = repo.scheduling_changes(mark)
        assert not read.whole
        mark = read.mark
        return [r.id for r in read.records]

    assert changed() == []
    with uow() as repo:  # the loop's pending note: not a fact
        repo.update_trial(first, TrialUpdate(pending_reason="waiting", queue_position=1))
    assert changed() == []
    with uow() as repo:
        second = repo.add_trial(experiment_id, {}, "normal", 3.0).id
    assert changed() == [second]
    with uow() as repo:
        write_trial(repo, first, TrialUpdate(state=TrialState.SCHEDULED))
        attempt = repo.add_attempt(first, 1, "k1", ["n0"], None, None, 3.0, num_slots=1)
    assert changed() == [first]
    with uow() as repo:  # when its processes began: what the loop judges the attempt by
        repo.update_attempt(attempt.id, AttemptUpdate(started_at=4.0))
    assert changed() == [first]
    with uow() as repo:
        repo.add_checkpoint(first, "c1", 10, 1, {}, "ckpt/c1", 1, 5.0)
    assert changed() == [first]
    with uow() as repo:
        repo.update_attempt(attempt.id, AttemptUpdate(outcome="PREEMPTED", ended_at=6.0))
        repo.update_trials([(second, TrialUpdate(attained_service=12.0))])
    assert changed() == [first, second]

    def fail() -> None:
        with uow() as repo:
            repo.update_trial(second, TrialUpdate(priority="high"))
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        fail()
    assert changed() == []
    with uow() as repo:  # a trial that left the queue is read in its new state
        write_trial(repo, second, TrialUpdate(state=TrialState.CANCELED))
    with uow() as repo:
        read = repo.scheduling_changes(mark)
    assert [(r.id, r.state) for r in read.records] == [(second, TrialState.CANCELED)]


def test_a_change_numbered_later_is_not_read_before_an_earlier_one_commits(
    uow: SqlUnitOfWork,
) -> None:
    """Two writers: the first takes its number and has not committed; the second must not
    commit a higher number before it, or a reader would pass over the first (ADR 0024)."""
    experiment_id, first = seed(uow)
    with uow() as repo:
        second = repo.add_trial(experiment_id, {}, "normal", 3.0).id
    with uow() as repo:
        mark = repo.scheduling_changes(None).mark
    session = sessionmaker(uow.engine)()
    try:
        # the first writer: numbered, not committed
        session.execute(sa_update(TrialRow).where(TrialRow.id == first).values(priority="high"))
        changes.touch(session, [first])
        changes.stamp(session)
        later = threading.Thread(target=lambda: _reprioritise(uow, second))
        later.start()
        later.join(timeout=1.0)
        assert later.is_alive(), "the second writer committed while the first held its number"
        with uow() as repo:
            assert repo.scheduling_changes(mark).records == []
        session.commit()
        later.join(timeout=30.0)
        assert not later.is_alive()
    finally:
        session.close()
    with uow() as repo:
        read = repo.scheduling_changes(mark)
    assert [r.id for r in read.records] == [first, second]
    assert read.mark == mark + 2


def _reprioritise(uow: SqlUnitOfWork, trial_id: int) -> None:
    with uow() as repo:
        repo.update_trial(trial_id, TrialUpdate(priority="low"))


def test_a_checkpoint_registered_while_the_loop_changes_its_trial_does_not_deadlock(
    uow: SqlUnitOfWork,
) -> None:
    """The runtime registers a checkpoint (its insert holds a key-share lock on the trial, for
    the foreign key) while the control loop's transaction has changed the same trial: both
    number the trial at commit, and neither may wait for the other's lock in a cycle."""
    _, trial = seed(uow)
    session = sessionmaker(uow.engine)()
    registered: list[BaseException | None] = []

    def register() -> None:
        try:
            with uow() as repo:
                repo.add_checkpoint(trial, "c1", 10, 1, {}, "ckpt/c1", 1, 5.0)
            registered.append(None)
        except BaseException as exc:  # handed to the test's thread
            registered.append(exc)

    try:
        # the loop: changed the trial, not committed yet
        session.execute(sa_update(TrialRow).where(TrialRow.id == trial).values(priority="high"))
        changes.touch(session, [trial])
        runtime = threading.Thread(target=register)
        runtime.start()
        runtime.join(timeout=1.0)  # it inserted the checkpoint and waits to number the trial
        changes.stamp(session)
        session.commit()
        runtime.join(timeout=30.0)
    finally:
        session.close()
    assert registered == [None]
    with uow() as repo:
        assert repo.get_trial(trial).priority == "high"  # type: ignore[union-attr]
        assert [c.uuid for c in repo.list_checkpoints(trial)] == ["c1"]


def test_active_records_hold_what_an_attempt_is_judged_by(uow: SqlUnitOfWork) -> None:
    experiment_id, first = seed(uow)
    with uow() as repo:
        second = repo.add_trial(experiment_id, {}, "normal", 3.0).id
        write_trial(repo, first, TrialUpdate(state=TrialState.SCHEDULED))
        write_trial(repo, first, TrialUpdate(state=TrialState.RUNNING, started_at=4.0))
        repo.update_trial(first, TrialUpdate(cancel_requested=True, stop_reason="canceled"))
        records = repo.active_records([TrialState.SCHEDULED, TrialState.RUNNING])
        whole = repo.get_trial(first)
    assert [r.id for r in records] == [first]  # trial `second` waits
    assert whole is not None
    assert second != first
    assert records[0] == (
        whole.id,
        whole.experiment_id,
        whole.tenant,
        whole.state,
        whole.cancel_requested,
        whole.stop_reason,
        whole.started_at,
    )
    assert (records[0].state, records[0].cancel_requested) == (TrialState.RUNNING, True)


def test_active_changes_number_what_an_attempt_is_judged_by(uow: SqlUnitOfWork) -> None:
    """A cancel, a stop's reason and every write to an attempt are numbered (the loop judges
    attempts from these changes, ADR 0025); a pending note is not; a trial that is no longer
    active is read in its new state."""
    experiment_id, first = seed(uow)
    with uow() as repo:
        second = repo.add_trial(experiment_id, {}, "normal", 3.0).id
        write_trial(repo, first, TrialUpdate(state=TrialState.SCHEDULED))
        attempt = repo.add_attempt(first, 1, "k1", ["n0"], None, None, 3.0, num_slots=1)
    with uow() as repo:
        whole = repo.active_changes(None)
        assert whole.records == repo.active_records([TrialState.SCHEDULED])
    assert whole.whole
    assert [r.id for r in whole.records] == [first]  # trial `second` waits
    mark = whole.mark

    def changed() -> list[tuple[int, TrialState, bool]]:
        nonlocal mark
        with uow() as repo:
            read = repo.active_changes(mark)
        assert not read.whole
        mark = read.mark
        return [(r.id, r.state, r.cancel_requested) for r in read.records]

    assert changed() == []
    with uow() as repo:
        repo.update_trial(first, TrialUpdate(pending_reason="waiting", queue_position=1))
    assert changed() == []
    with uow() as repo:  # a user's cancel, written by the API
        repo.update_trial(first, TrialUpdate(cancel_requested=True, stop_reason="canceled"))
    assert changed() == [(first, TrialState.SCHEDULED, True)]
    for update in (
        AttemptUpdate(started_at=4.0),
        AttemptUpdate(stop_requested_at=5.0),  # a pause, written by the steering service
        AttemptUpdate(terminate_sent_at=6.0),
    ):
        with uow() as repo:
            repo.update_attempt(attempt.id, update)
        assert changed() == [(first, TrialState.SCHEDULED, True)]
    with uow() as repo:
        repo.update_attempt(attempt.id, AttemptUpdate(outcome="CANCELED", ended_at=7.0))
        write_trial(repo, first, TrialUpdate(state=TrialState.CANCELED))
        repo.update_trial(second, TrialUpdate(priority="high"))
    assert changed() == [(first, TrialState.CANCELED, True), (second, TrialState.QUEUED, False)]
    with uow() as repo:  # what an experiment's state is derived from
        assert sorted(repo.trial_states(experiment_id)) == [
            TrialState.CANCELED,
            TrialState.QUEUED,
        ]
        assert repo.trial_states(10_000) == []
