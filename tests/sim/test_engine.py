"""The simulator on small traces with answers computed by hand."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from trainhub.core.scheduling import (
    BasePolicy,
    DecisionList,
    FairShareConfig,
    FairSharePolicy,
    FifoPolicy,
    Snapshot,
    Start,
    TenantShare,
)
from trainhub.sim.cluster import ClusterSpec
from trainhub.sim.engine import SimConfig, SimulationError, Simulator
from trainhub.sim.trace import TraceJob


def job(i: int, at: float, duration: float, gpus: int = 1, tenant: str = "t") -> TraceJob:
    return TraceJob(job_id=i, submit_s=at, duration_s=duration, num_gpus=gpus, tenant=tenant)


def by_job(result: object) -> dict[int, object]:
    return {r.job_id: r for r in result.records}  # type: ignore[attr-defined]


def test_fifo_completion_times_on_a_three_job_trace() -> None:
    # one node of 2 GPUs; J0 takes both until 10, then J1 and J2 share it
    jobs = [job(0, 0, 10, gpus=2), job(1, 1, 5), job(2, 2, 3)]
    result = Simulator(jobs, ClusterSpec.uniform(1, 2), FifoPolicy()).run()
    records = by_job(result)
    assert [records[i].jct_s for i in range(3)] == [10.0, 14.0, 11.0]  # type: ignore[attr-defined]
    assert [records[i].queueing_delay_s for i in range(3)] == [0.0, 9.0, 8.0]  # type: ignore[attr-defined]
    summary = result.summary()
    assert summary["avg_jct_s"] == pytest.approx(35 / 3)
    assert summary["makespan_s"] == 15.0
    # GPU-seconds used: 2*10 + 5 + 3 = 28 of 2*15
    assert summary["utilisation"] == pytest.approx(28 / 30)
    assert summary["preemptions"] == 0


def test_gangs_span_nodes_whole_or_not_at_all() -> None:
    jobs = [job(0, 0, 10, gpus=6), job(1, 0, 10, gpus=3)]
    result = Simulator(jobs, ClusterSpec.uniform(2, 4), FifoPolicy()).run()
    records = by_job(result)
    assert records[0].first_start_s == 0.0  # type: ignore[attr-defined]
    # 2 GPUs left: the 3-GPU gang waits for the 6-GPU one
    assert records[1].first_start_s == 10.0  # type: ignore[attr-defined]


class _SplitGang(BasePolicy):
    name = "broken"

    def decide(self, snapshot: Snapshot) -> Sequence[Start]:
        # one rank of each gang only
        return [Start(t.trial_id, ("node-0",)) for t in snapshot.queue]


def test_the_simulator_rejects_a_partial_gang() -> None:
    with pytest.raises(SimulationError, match="gang"):
        Simulator([job(0, 0, 10, gpus=2)], ClusterSpec.uniform(1, 4), _SplitGang()).run()


def test_a_job_that_never_fits_is_rejected_not_waited_for() -> None:
    result = Simulator(
        [job(0, 0, 10, gpus=16), job(1, 0, 5)], ClusterSpec.uniform(1, 8), FifoPolicy()
    ).run()
    summary = result.summary()
    assert summary["rejected"] == 1
    assert summary["completed"] == 1


def test_passes_follow_events_not_the_clock() -> None:
    jobs = [job(0, 0, 100), job(1, 500_000, 100), job(2, 1_000_000, 100)]
    result = Simulator(jobs, ClusterSpec.uniform(1, 1), FifoPolicy()).run()
    assert result.passes == 3
    assert result.summary()["avg_jct_s"] == 100.0


GUARANTEES = {"a": TenantShare(guaranteed_slots=1), "b": TenantShare(guaranteed_slots=1)}
RECLAIM = FairShareConfig(min_run_time_s=600.0, service_thresholds_slot_s=())
SIM = SimConfig(checkpoint_interval_s=600.0, checkpoint_time_s=30.0, restart_overhead_s=60.0)


def test_a_tenant_below_its_guarantee_gets_it_back_within_a_tick_and_a_checkpoint() -> None:
    # b borrows both GPUs from t=0; a's job arrives at t=1000 (b's jobs are past min run time)
    jobs = [
        job(0, 0, 10_000, tenant="b"),
        job(1, 0, 10_000, tenant="b"),
        job(2, 1000, 100, tenant="a"),
    ]
    result = Simulator(
        jobs, ClusterSpec.uniform(1, 2), FairSharePolicy(RECLAIM), GUARANTEES, SIM
    ).run()
    records = by_job(result)
    # preempted at 1000 (the arrival's pass), GPUs back at 1030: a starts then
    assert records[2].first_start_s == pytest.approx(1030.0)  # type: ignore[attr-defined]
    assert result.summary()["preemptions"] == 1
    victim = next(r for r in result.records if r.preemptions)
    # the victim ran 1030 s, checkpointed at 600: loses 430 s and pays 60 s on restart; it
    # restarts when a's job ends (1130)
    assert victim.finish_s == pytest.approx(1130.0 + 60.0 + (10_000 - 600))


def test_minimum_run_time_delays_the_reclaim_to_the_first_allowed_instant() -> None:
    jobs = [
        job(0, 0, 10_000, tenant="b"),
        job(1, 0, 10_000, tenant="b"),
        job(2, 100, 100, tenant="a"),
    ]
    result = Simulator(
        jobs, ClusterSpec.uniform(1, 2), FairSharePolicy(RECLAIM), GUARANTEES, SIM
    ).run()
    # b's jobs may be preempted from 600 on; the policy asks to be woken then
    assert by_job(result)[2].first_start_s == pytest.approx(630.0)  # type: ignore[attr-defined]


def test_save_on_preempt_loses_no_work() -> None:
    config = SimConfig(checkpoint_time_s=30.0, restart_overhead_s=0.0, save_on_preempt=True)
    jobs = [
        job(0, 0, 10_000, tenant="b"),
        job(1, 0, 10_000, tenant="b"),
        job(2, 1000, 100, tenant="a"),
    ]
    result = Simulator(
        jobs, ClusterSpec.uniform(1, 2), FairSharePolicy(RECLAIM), GUARANTEES, config
    ).run()
    victim = next(r for r in result.records if r.preemptions)
    assert victim.finish_s == pytest.approx(1130.0 + (10_000 - 1030))
    assert result.summary()["lost_gpu_h"] == 0.0


def test_fairness_is_measured_against_guarantees() -> None:
    jobs = [
        job(0, 0, 10_000, tenant="b"),
        job(1, 0, 10_000, tenant="b"),
        job(2, 1000, 100, tenant="a"),
    ]
    fair = Simulator(
        jobs, ClusterSpec.uniform(1, 2), FairSharePolicy(RECLAIM), GUARANTEES, SIM
    ).run()
    fifo = Simulator(jobs, ClusterSpec.uniform(1, 2), FifoPolicy(), GUARANTEES, SIM).run()
    # a waited 30 s of its 130 s of demand under fair, 9000 s under FIFO
    assert fair.timeline.ratios()["a"] == pytest.approx(100 / 130)
    assert fifo.timeline.ratios()["a"] == pytest.approx(100 / 9100)
    assert fair.timeline.ratios()["b"] == pytest.approx(1.0)


class _Silent(BasePolicy):
    """Starts nothing: the simulator must stop instead of looping."""

    name = "silent"

    def decide(self, snapshot: Snapshot) -> DecisionList:
        return DecisionList()


def test_a_policy_that_never_starts_anything_ends_the_run() -> None:
    result = Simulator([job(0, 0, 10)], ClusterSpec.uniform(1, 1), _Silent()).run()
    assert result.summary()["unfinished"] == 1


class _Seen(FifoPolicy):
    """FIFO that records the expected durations it was shown."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, float | None] = {}

    def decide(self, snapshot: Snapshot) -> DecisionList:
        for trial in snapshot.queue:
            self.seen[trial.trial_id] = trial.expected_duration_s
        return super().decide(snapshot)


def test_estimated_durations_are_the_median_of_finished_jobs_of_the_tenant_and_size() -> None:
    # one GPU: the jobs run one after another; 1-GPU jobs of "t" finish in 10, 20, 30 s
    jobs = [job(0, 0, 10), job(1, 0, 20), job(2, 0, 30), job(3, 100, 50), job(4, 100, 50)]
    jobs.append(job(5, 100, 50, tenant="u"))
    policy = _Seen()
    Simulator(
        jobs, ClusterSpec.uniform(1, 1), policy, config=SimConfig(estimated_durations=True)
    ).run()
    assert [policy.seen[i] for i in range(3)] == [None, None, None]  # nothing had finished
    assert policy.seen[3] == policy.seen[4] == 20.0  # median of 10, 20, 30
    assert policy.seen[5] is None  # another tenant: its own history
    off = _Seen()
    Simulator(jobs, ClusterSpec.uniform(1, 1), off).run()
    assert set(off.seen.values()) == {None}


def test_memory_requests_on_nodes_without_a_memory_size_are_measured() -> None:
    # `trainhub sim --nodes` builds nodes of unknown (infinite) memory; openb pods ask for some
    # the 2-GPU gang waits while one GPU is free: that GPU's room is measured
    jobs = [
        TraceJob(job_id=i, submit_s=i, duration_s=10, num_gpus=1 + i, memory_gb_per_worker=4.0)
        for i in range(2)
    ]
    summary = Simulator(jobs, ClusterSpec.uniform(1, 2), FifoPolicy()).run().summary()
    assert summary["unfinished"] == 0
    assert summary["idle_while_fits"] == 0.0


def test_a_ticking_loop_starts_on_ticks_and_sees_ends_at_the_next_tick() -> None:
    """``tick_s``: a job arriving at 10 s starts at the 60 s tick; its end at 160 s is seen at
    the 180 s tick, when the next job starts; the GPU is held until then."""
    jobs = [job(0, 10, 100), job(1, 20, 50)]
    sim = SimConfig(tick_s=60.0)
    result = Simulator(jobs, ClusterSpec.uniform(1, 1), FifoPolicy(), config=sim).run()
    records = by_job(result)
    assert records[0].first_start_s == 60.0  # type: ignore[attr-defined]
    assert records[0].finish_s == 180.0  # type: ignore[attr-defined]
    assert records[1].first_start_s == 180.0  # type: ignore[attr-defined]
    assert records[1].finish_s == 240.0  # type: ignore[attr-defined]


def test_a_preempted_job_exiting_before_its_end_loses_work_even_when_both_fall_in_one_tick() -> (
    None
):
    """A preemption at the 60 s tick: the job exits at 90 s (before its work would end at
    100 s); both are seen at the 120 s tick, and the exit wins: the job queues again having
    saved nothing (no checkpoint yet) and finishes after a restart."""

    class PreemptAt60(BasePolicy):
        name = "preempt-at-60"

        def __init__(self) -> None:
            self.inner = FifoPolicy()

        def decide(self, snapshot: Snapshot) -> Sequence[object]:  # type: ignore[override]
            if snapshot.now == 60.0 and snapshot.running:
                from trainhub.core.scheduling import Preempt

                return [Preempt(snapshot.running[0].trial_id, "test")]
            return self.inner.decide(snapshot)

    sim = SimConfig(tick_s=60.0, checkpoint_interval_s=600.0, restart_overhead_s=0.0)
    # job 1 (2 GPUs, never fitting beside job 0) keeps something waiting, so the 60 s tick runs
    jobs = [job(0, 0, 100), job(1, 30, 10, gpus=2)]
    result = Simulator(jobs, ClusterSpec.uniform(1, 2), PreemptAt60(), config=sim)
    done = result.run()
    record = by_job(done)[0]
    assert record.preemptions == 1  # type: ignore[attr-defined]
    # restarted at the 120 s tick with all 100 s to do again: ends at 220 s, seen at 240 s
    assert record.finish_s == 240.0  # type: ignore[attr-defined]
    assert done.lost_gpu_s == pytest.approx(90.0)
