"""The simulator's duration estimates follow the server's books: measured run times, read on
the loop's refresh schedule, the facts whose estimate changed named for a remake."""

from __future__ import annotations

import pytest

from trainhub.core.scheduling import create_policy
from trainhub.sim.cluster import ClusterSpec
from trainhub.sim.engine import SimConfig, Simulator
from trainhub.sim.estimates import ServerEstimates, measured_run_s
from trainhub.sim.trace import TraceJob

A1 = ("a", "a:1")


def test_the_loop_measures_from_the_tick_that_saw_the_attempt_running() -> None:
    assert measured_run_s(120.0, 720.0, 60.0) == 540.0  # running seen at 180
    assert measured_run_s(120.0, 180.0, 60.0) == 60.0  # ended before that tick: from launch
    assert measured_run_s(120.0, 700.0, 0.0) == 580.0  # no tick: the instants themselves


def test_finishes_count_from_the_first_refresh_at_or_after_the_tick_that_saw_them() -> None:
    books = ServerEstimates(min_samples=2, window=None, refresh_s=90.0, tick_s=60.0, origin=0.0)
    assert books.period == 120.0  # the loop refreshes at the first tick 90 s after the last
    assert books.estimate(7, A1) is None
    assert books.estimate(6, A1, track=False) is None  # its policy does not read it now
    books.finished(60.0, 1, A1, 100.0)
    books.finished(180.0, 2, A1, 300.0)
    assert books.publish(60.0) == {}  # the refresh at 0 read nothing
    assert books.publish(120.0) == {}  # one run read at 120: too few for a median
    assert books.publish(239.9) == {}
    assert books.publish(240.0) == {7: 200.0}  # job 7 waits with the new estimate
    assert books.estimate(8, A1) == 200.0
    books.forget(7, A1)
    books.finished(240.0, 3, A1, 500.0)
    assert books.publish(300.0) == {}  # no refresh between 240 and 300
    assert books.publish(360.0) == {8: 300.0}


def test_a_finish_changes_the_estimate_of_the_users_other_projects_too() -> None:
    books = ServerEstimates(min_samples=1, window=None, refresh_s=0.0, tick_s=0.0, origin=0.0)
    assert books.estimate(1, ("a", "a:4")) is None
    books.finished(10.0, 2, A1, 50.0)
    # no run of a:4 yet: the user's runs stand in (the third tier)
    assert books.publish(10.0) == {1: 50.0}


def test_runs_of_zero_seconds_are_not_read_and_the_window_drops_the_oldest() -> None:
    books = ServerEstimates(min_samples=1, window=2, refresh_s=0.0, tick_s=0.0, origin=0.0)
    books.estimate(9, A1)
    books.finished(1.0, 1, A1, 0.0)
    assert books.publish(1.0) == {}
    for at, run_s in ((2.0, 1000.0), (3.0, 10.0), (4.0, 20.0)):
        books.finished(at, int(at), A1, run_s)
    assert books.publish(4.0) == {9: 15.0}


def _estimates_seen(jobs: list[TraceJob], cfg: SimConfig) -> dict[int, float | None]:
    seen: dict[int, float | None] = {}
    policy = create_policy("sjf")  # it reads the queued jobs' estimates
    decide = policy.decide

    def spy(snapshot):  # type: ignore[no-untyped-def]
        for trial in snapshot.queue:
            seen[trial.trial_id] = trial.expected_duration_s
        return decide(snapshot)

    policy.decide = spy  # type: ignore[method-assign]
    Simulator(jobs, ClusterSpec.uniform(1, 1, cpus_per_node=8), policy, None, cfg).run()
    return seen


@pytest.mark.parametrize("tick_s", [0.0, 60.0])
def test_a_queued_job_sees_the_measured_runs_of_the_jobs_before_it(tick_s: float) -> None:
    """One GPU, three jobs of one tenant in a row: the third waits while the first two run;
    it is shown their median as the loop measured them (with the tick, a minute less each:
    the loop sees an attempt running at the tick after its launch), read at the refresh after
    the second ended, and the facts it waits with are made again when that happens."""
    jobs = [TraceJob(i, float(i), 600.0, 1, "a") for i in (1, 2, 3)]
    cfg = SimConfig(
        estimated_durations=True, estimate_min_samples=2, tick_s=tick_s, estimates_refresh_s=60.0
    )
    seen = _estimates_seen(jobs, cfg)
    assert seen[3] == 600.0 - tick_s
    without = _estimates_seen(jobs, SimConfig())
    assert without[3] is None
