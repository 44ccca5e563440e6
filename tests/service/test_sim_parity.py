"""Same events, same decisions: the control loop and the simulator run one policy alike.

One job sequence goes through the simulator and through the control loop (real SQLite, the
fake executor, a stepped clock). The driver of the loop plays the cluster the way the
simulator does: a started trial runs for its remaining duration, a preempted one exits
``checkpoint_time_s`` later keeping its progress (``save_on_preempt``), and the loop ticks at
every instant the simulator runs a scheduling pass (events, and the wake-ups policies ask
for). Every start (with its placement) and every preemption must match, at the same time,
for every policy.

One difference is left out on purpose: a trial whose work ends while it is being preempted
completes in the simulator, while the server, which sees only exit code 0 after
should_stop(), requeues it (its next attempt resumes at the end and exits at once). The jobs
below never end in their preemption's checkpoint time.

In the tests of one step per event, durations are unknown to both (the simulator without
``known_durations``, the server without enough completed trials to estimate).

Under realistic conditions (issue 27, ``test_a_ticking_loop_with_periodic_checkpoints...``)
the loop ticks on a fixed period and sees each exit at the first tick after it (the
simulator's ``tick_s``); jobs checkpoint periodically (the driver registers each checkpoint
in the database at the instant the simulated job makes it, which is what the policy's view of
the work at risk is read from), a preempted job exits ``checkpoint_time_s`` later and loses
the work since its last checkpoint, and a restart pays its overhead before making progress.
With duration estimates (``test_estimated_durations...``) both estimate from the run times the
loop measured: each tenant submits as a user of its own, one project per GPU count (the
simulator's stand-ins for a trace's missing users and projects), the loop reads the finished
runs every 60 s and the simulator shows the policy the same medians at the same ticks
(``sim.estimates``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.service.loop_harness import LoopHarness
from trainhub.core.scheduling import (
    BasePolicy,
    Decision,
    FairShareConfig,
    LasConfig,
    Snapshot,
    TenantShare,
    create_policy,
    split_decisions,
)
from trainhub.core.topology import TopologyNeed
from trainhub.service.control_loop import LoopConfig
from trainhub.sim.cluster import ClusterSpec
from trainhub.sim.engine import SimConfig, Simulator
from trainhub.sim.trace import TraceJob

HALF_LIFE_S = 3600.0
CHECKPOINT_TIME_S = 30.0
TENANTS = {"default": TenantShare(), "a": TenantShare(4), "b": TenantShare(4)}
CLUSTER = ClusterSpec.uniform(2, 4, cpus_per_node=64)

# tenant a borrows the whole cluster; b comes for its guarantee; small and wide jobs mix
JOBS = [
    TraceJob(1, 0.0, 3000.0, 4, "a", cpus_per_worker=1.0),
    TraceJob(2, 10.0, 2500.0, 4, "a", cpus_per_worker=1.0),
    TraceJob(3, 20.0, 500.0, 2, "a", cpus_per_worker=1.0),
    TraceJob(4, 700.0, 1010.0, 4, "b", cpus_per_worker=1.0),
    TraceJob(5, 800.0, 400.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(6, 900.0, 200.0, 1, "a", cpus_per_worker=1.0),
    TraceJob(7, 1500.0, 600.0, 8, "b", cpus_per_worker=1.0),
    TraceJob(8, 1600.0, 100.0, 1, "a", cpus_per_worker=1.0),
    TraceJob(9, 5000.0, 300.0, 3, "b", cpus_per_worker=1.0),
]

# reclaim patience: b held its guarantee for 30 hours, then a borrows b's GPUs; b comes back
# for 2 GPUs standing well above 97% of its entitlement, so it waits for a's first job to
# end instead of preempting a's borrowed one (without patience it preempts)
PATIENCE_JOBS = [
    TraceJob(1, 0.0, 108_000.0, 4, "b", cpus_per_worker=1.0),
    TraceJob(2, 0.0, 111_000.0, 4, "a", cpus_per_worker=1.0),
    TraceJob(3, 108_100.0, 5_000.0, 4, "a", cpus_per_worker=1.0),
    TraceJob(4, 108_500.0, 600.0, 2, "b", cpus_per_worker=1.0),
]
SEQUENCES = {"reclaim": JOBS, "patience": PATIENCE_JOBS}

Log = list[tuple[float, str, int, tuple[str, ...]]]


class Recorder(BasePolicy):
    """Wraps a policy and writes down what it decided, and when."""

    def __init__(self, inner: BasePolicy) -> None:
        self.inner = inner
        self.name = inner.name
        self.queue_order = inner.queue_order
        self.standing_half_life_s = inner.standing_half_life_s
        self.reads_queued_durations = inner.reads_queued_durations
        self.reads_running_durations = inner.reads_running_durations
        self.config: Any = getattr(inner, "config", None)
        self.log: Log = []
        self.wake_at: float | None = None

    def decide(self, snapshot: Snapshot) -> Sequence[Decision]:
        decisions = self.inner.decide(snapshot)
        starts, preempts, self.wake_at = split_decisions(decisions)
        self.log += [(snapshot.now, "start", s.trial_id, s.placement) for s in starts]
        self.log += [(snapshot.now, "preempt", p.trial_id, ()) for p in preempts]
        return decisions


def make_policy(name: str, patience: bool = True) -> Recorder:
    fair = FairShareConfig(
        half_life_s=HALF_LIFE_S,
        min_run_time_s=300,
        preemption_cooldown_s=600,
        patience_share=0.97 if patience else None,
    )
    las = LasConfig(thresholds_slot_s=(2000.0, 20000.0), min_run_time_s=300)
    return Recorder(create_policy(name, fair=fair, las=las))


def simulate(
    name: str,
    jobs: Sequence[TraceJob] = JOBS,
    patience: bool = True,
    cluster: ClusterSpec = CLUSTER,
) -> Log:
    recorder = make_policy(name, patience)
    config = SimConfig(
        checkpoint_interval_s=0.0,
        checkpoint_time_s=CHECKPOINT_TIME_S,
        save_on_preempt=True,
        restart_overhead_s=0.0,
        half_life_s=HALF_LIFE_S,
    )
    Simulator(jobs, cluster, recorder, TENANTS, config).run()
    return recorder.log


def spec_of(job: TraceJob) -> str:
    topology = ""
    if job.topology is not None:
        kind = "required" if job.topology.required else "preferred"
        topology = f", topology: {{{kind}: {job.topology.level}}}"
    # the project the simulator's estimates stand in for this job (sim.engine._key)
    return (
        f"name: job-{job.job_id}\nproject: {job.tenant}-{job.num_gpus}gpu\nentrypoint: sleep 1\n"
        f"resources: {{workers: {job.num_gpus}, gpus_per_worker: 1, cpus_per_worker: 1"
        f"{topology}}}\n"
    )


def drive_control_loop(
    name: str, root: Path, jobs: Sequence[TraceJob] = JOBS, cluster: ClusterSpec = CLUSTER
) -> Log:
    recorder = make_policy(name)
    config = LoopConfig(
        "http://127.0.0.1:1",
        usage_half_life_s=HALF_LIFE_S,
        stop_wait_s=math.inf,  # the simulated scripts stop on should_stop(), never by SIGTERM
        estimate_min_samples=10**9,
    )
    h = LoopHarness(root, recorder, [n.node() for n in cluster.nodes], config)
    h.clock.now = 0.0
    try:
        for tenant, share in TENANTS.items():
            if tenant != "default":
                h.admin.create_tenant(h.principal, tenant, share.guaranteed_slots)
        arrivals = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
        remaining = {j.job_id: j.duration_s for j in jobs}
        started: dict[int, float] = {}
        # (time, kind, trial, attempt): 0 = finish, 1 = leave after a preemption; like the
        # simulator's, the finish of an attempt that was preempted stays, an instant of its own
        events: list[tuple[float, int, int, int]] = []
        attempt: dict[int, int] = {}
        # like the simulator: a wake-up is kept when it is earlier than the one pending, and
        # every wake-up kept is an instant of its own
        wakes: list[float] = []
        next_wake = math.inf
        seen = 0
        while arrivals or events or wakes:
            now = min(
                arrivals[0].submit_s if arrivals else math.inf,
                events[0][0] if events else math.inf,
                wakes[0] if wakes else math.inf,
            )
            h.clock.now = now
            while wakes and wakes[0] <= now:
                heapq.heappop(wakes)
                if next_wake <= now:
                    next_wake = math.inf
            while arrivals and arrivals[0].submit_s <= now:
                job = arrivals.pop(0)
                assert h.submit(spec_of(job), tenant=job.tenant) == job.job_id
            while events and events[0][0] <= now:
                _, kind, trial_id, number = heapq.heappop(events)
                if number != attempt[trial_id] or trial_id not in started:
                    continue
                key = h.key(trial_id)
                if kind == 1:  # saved on should_stop(): keeps what it ran
                    remaining[trial_id] -= now - started[trial_id]
                del started[trial_id]
                h.executor.exit(key, [0] * len(h.executor.attempts[key].ranks))
            recorder.wake_at = None
            h.tick()
            for at, what, trial_id, _ in recorder.log[seen:]:
                assert at == now
                if what == "start":
                    h.executor.run(h.key(trial_id))
                    started[trial_id] = now
                    attempt[trial_id] = attempt.get(trial_id, 0) + 1
                    end = now + remaining[trial_id]
                    heapq.heappush(events, (end, 0, trial_id, attempt[trial_id]))
                else:
                    leave = now + CHECKPOINT_TIME_S
                    heapq.heappush(events, (leave, 1, trial_id, attempt[trial_id]))
            seen = len(recorder.log)
            wake = recorder.wake_at
            if wake is not None and now < wake < next_wake:
                next_wake = wake
                heapq.heappush(wakes, wake)
        return recorder.log
    finally:
        h.close()


# issue 27's realistic conditions: a 60 s tick, checkpoints every 400 s of work (none when
# told to stop), a restart paying 45 s; the jobs' ends and checkpoints fall between ticks
REALISTIC = SimConfig(
    checkpoint_interval_s=400.0,
    checkpoint_time_s=CHECKPOINT_TIME_S,
    save_on_preempt=False,
    restart_overhead_s=45.0,
    half_life_s=HALF_LIFE_S,
    tick_s=60.0,
)


# the loop's estimates: medians of two runs, read every 60 s
ESTIMATED = replace(
    REALISTIC, estimated_durations=True, estimate_min_samples=2, estimates_refresh_s=60.0
)


def simulate_realistic(name: str, jobs: Sequence[TraceJob], sim: SimConfig = REALISTIC) -> Log:
    recorder = make_policy(name)
    Simulator(jobs, CLUSTER, recorder, TENANTS, sim).run()
    return recorder.log


def drive_ticking_loop(
    name: str, root: Path, jobs: Sequence[TraceJob], sim: SimConfig = REALISTIC
) -> tuple[Log, int]:
    """The loop ticking every ``sim.tick_s``; between ticks the driver plays each job at its
    exact times: arrivals, periodic checkpoints, exits (a finish, or a preempted job's exit
    after saving nothing more than its last checkpoint). Returns the log and the number of
    checkpoints registered."""
    recorder = make_policy(name)
    estimated = sim.estimated_durations
    config = LoopConfig(
        "http://127.0.0.1:1",
        usage_half_life_s=HALF_LIFE_S,
        stop_wait_s=math.inf,
        estimate_min_samples=sim.estimate_min_samples if estimated else 10**9,
        estimates_refresh_s=sim.estimates_refresh_s,
    )
    h = LoopHarness(root, recorder, [n.node() for n in CLUSTER.nodes], config)
    tick, every = sim.tick_s, sim.checkpoint_interval_s
    try:
        users = {}
        for tenant, share in TENANTS.items():
            if tenant != "default":
                h.admin.create_tenant(h.principal, tenant, share.guaranteed_slots)
                users[tenant] = h.member(f"user-{tenant}", tenant)
        remaining = {j.job_id: j.duration_s for j in jobs}
        unfinished = set(remaining)
        # (time, order, kind, trial, attempt): 0 arrival, 1 checkpoint, 2 finish, 3 exit
        # after a preemption
        plan: list[tuple[float, int, int, int, int]] = [
            (j.submit_s, j.job_id, 0, j.job_id, 0) for j in jobs
        ]
        heapq.heapify(plan)
        by_id = {j.job_id: j for j in jobs}
        attempt: dict[int, int] = {}
        # trial -> (its attempt's start, restart overhead): while it runs
        started: dict[int, tuple[float, float]] = {}
        checkpoints = seen = order = 0
        now = 0.0
        while unfinished:
            assert now < 1e6, "the jobs never finished"
            while plan and plan[0][0] <= now:
                at, _, kind, trial_id, number = heapq.heappop(plan)
                h.clock.now = at
                if kind == 0:
                    job = by_id[trial_id]
                    principal = users[job.tenant] if estimated else None
                    assert h.submit(spec_of(job), job.tenant, principal) == trial_id
                    continue
                if number != attempt[trial_id] or trial_id not in started:
                    continue  # an attempt that already ended
                key = h.key(trial_id)
                if kind == 1:
                    with h.uow() as repo:
                        repo.add_checkpoint(
                            trial_id, f"c{trial_id}-{number}-{at}", 0, number, {}, key, 0, at
                        )
                    checkpoints += 1
                    continue
                begun, cost = started.pop(trial_id)
                if kind == 3:  # exits keeping the work up to its last checkpoint
                    productive = max(0.0, at - begun - cost)
                    remaining[trial_id] -= min(
                        remaining[trial_id], math.floor(productive / every) * every
                    )
                else:
                    unfinished.discard(trial_id)
                h.executor.exit(key, [0] * len(h.executor.attempts[key].ranks))
            h.clock.now = now
            h.tick()
            for at, what, trial_id, _ in recorder.log[seen:]:
                assert at == now
                order += 1
                if what == "start":
                    h.executor.run(h.key(trial_id))
                    number = attempt[trial_id] = attempt.get(trial_id, 0) + 1
                    cost = sim.restart_overhead_s if number > 1 else 0.0
                    started[trial_id] = (now, cost)
                    end = now + cost + remaining[trial_id]
                    heapq.heappush(plan, (end, order, 2, trial_id, number))
                    k = 1
                    while now + cost + k * every < end:
                        heapq.heappush(plan, (now + cost + k * every, order, 1, trial_id, number))
                        k += 1
                else:
                    leave = now + sim.checkpoint_time_s
                    heapq.heappush(plan, (leave, order, 3, trial_id, attempt[trial_id]))
            seen = len(recorder.log)
            now += tick
        return recorder.log, checkpoints
    finally:
        h.close()


# preemptions whose exits lose work, restarts, ends and checkpoints between ticks
REALISTIC_JOBS = [
    TraceJob(1, 0.0, 3000.0, 4, "a", cpus_per_worker=1.0),
    TraceJob(2, 10.0, 2500.0, 4, "a", cpus_per_worker=1.0),
    TraceJob(3, 20.0, 520.0, 2, "a", cpus_per_worker=1.0),
    TraceJob(4, 1300.0, 1010.0, 4, "b", cpus_per_worker=1.0),
    TraceJob(5, 1330.0, 430.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(6, 1400.0, 230.0, 1, "a", cpus_per_worker=1.0),
    TraceJob(7, 2000.0, 610.0, 8, "b", cpus_per_worker=1.0),
    TraceJob(8, 2100.0, 130.0, 1, "a", cpus_per_worker=1.0),
    TraceJob(9, 6000.0, 310.0, 3, "b", cpus_per_worker=1.0),
]


@pytest.mark.parametrize("policy", ["fifo", "sjf", "las", "fair"])
def test_a_ticking_loop_with_periodic_checkpoints_decides_as_the_simulator(
    policy: str, tmp_path: Path
) -> None:
    expected = simulate_realistic(policy, REALISTIC_JOBS)
    got, checkpoints = drive_ticking_loop(policy, tmp_path, REALISTIC_JOBS)
    assert got == expected
    assert checkpoints > 0
    # every decision on a tick
    assert all(at % REALISTIC.tick_s == 0 for at, _, _, _ in expected)


def test_the_realistic_sequence_preempts_loses_work_and_restarts() -> None:
    """Parity above covers preemptions whose exits lose work and restarts that pay for it."""
    recorder = make_policy("fair")
    result = Simulator(REALISTIC_JOBS, CLUSTER, recorder, TENANTS, REALISTIC).run()
    assert any(what == "preempt" for _, what, _, _ in recorder.log)
    assert result.lost_gpu_s > 0
    starts = [t for _, what, t, _ in recorder.log if what == "start"]
    assert len(starts) > len(set(starts))  # some trial started again


@pytest.mark.parametrize("sequence", sorted(SEQUENCES))
@pytest.mark.parametrize("policy", ["fifo", "sjf", "las", "fair"])
def test_same_events_give_the_same_decisions(policy: str, sequence: str, tmp_path: Path) -> None:
    jobs = SEQUENCES[sequence]
    expected = simulate(policy, jobs)
    assert any(what == "start" for _, what, _, _ in expected)
    assert drive_control_loop(policy, tmp_path, jobs) == expected


def test_the_sequence_exercises_preemption() -> None:
    """The fair policy preempts here: parity covers preemptions, not only starts."""
    assert any(what == "preempt" for _, what, _, _ in simulate("fair"))


def test_the_patience_sequence_waits_where_reclaiming_would_preempt() -> None:
    """b's standing (kept alike by both, see above) decides it: it waits for job 2's end."""
    patient = simulate("fair", PATIENCE_JOBS)
    assert not any(what == "preempt" for _, what, _, _ in patient)
    assert (111_000.0, "start", 4) in [(at, what, t) for at, what, t, _ in patient]
    eager = simulate("fair", PATIENCE_JOBS, patience=False)
    assert [t for _, what, t, _ in eager if what == "preempt"] == [3]


# issue 30: racks of 2 nodes x 2 GPUs; gangs that require a rack or prefer one, small jobs that
# fragment racks, a gang that waits for a rack to empty
RACKS = ClusterSpec.racks(1, 2, 2, 2, cpus_per_node=64)
RACK, PREFER = TopologyNeed("rack", True), TopologyNeed("rack", False)
RACK_JOBS = [
    TraceJob(1, 0.0, 3000.0, 1, "a", cpus_per_worker=1.0),
    TraceJob(2, 10.0, 2500.0, 1, "a", cpus_per_worker=1.0, topology=PREFER),
    TraceJob(3, 20.0, 800.0, 4, "b", cpus_per_worker=1.0, topology=RACK),
    TraceJob(4, 30.0, 600.0, 2, "b", cpus_per_worker=1.0, topology=PREFER),
    TraceJob(5, 900.0, 400.0, 3, "a", cpus_per_worker=1.0, topology=RACK),
    TraceJob(6, 1000.0, 200.0, 1, "b", cpus_per_worker=1.0),
]


@pytest.mark.parametrize("policy", ["fifo", "fair"])
def test_labelled_nodes_and_topology_gangs_decide_alike(policy: str, tmp_path: Path) -> None:
    expected = simulate(policy, RACK_JOBS, cluster=RACKS)
    labels = {n.node_id: n.labels["rack"] for n in RACKS.nodes}
    for _, what, trial_id, placement in expected:
        if what == "start" and trial_id in (3, 5):
            assert len({labels[p] for p in placement}) == 1  # never straddles racks
    assert any(what == "start" and t == 3 for _, what, t, _ in expected)
    assert drive_control_loop(policy, tmp_path, RACK_JOBS, cluster=RACKS) == expected


# estimates, shortest first: tenant a's 1-GPU jobs are short, b's 2-GPU jobs long; once the
# first runs are read, b fills the cluster and a queue builds where the estimates decide who
# goes first
SHORT_FIRST_JOBS = [
    TraceJob(1, 0.0, 300.0, 1, "a", cpus_per_worker=1.0),
    TraceJob(2, 0.0, 330.0, 1, "a", cpus_per_worker=1.0),
    TraceJob(3, 0.0, 2000.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(4, 0.0, 2130.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(5, 10.0, 290.0, 1, "a", cpus_per_worker=1.0),
    TraceJob(6, 2200.0, 1810.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(7, 2200.0, 2410.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(8, 2200.0, 3010.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(9, 2200.0, 3610.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(10, 2210.0, 1510.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(11, 2220.0, 250.0, 1, "a", cpus_per_worker=1.0),
    TraceJob(12, 2230.0, 270.0, 1, "a", cpus_per_worker=1.0),
    TraceJob(13, 2240.0, 1410.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(14, 2250.0, 230.0, 1, "a", cpus_per_worker=1.0),
]

# estimates, victims: b's 2-GPU runs take about 5,000 s; b borrows with job 5 (from 1,020 s)
# and, once that estimate is read, with jobs 6 to 8; when a comes back for 2 GPUs, job 5 is
# the cheapest victim by the work since its checkpoint but expected to end within the fair
# policy's victim_time_left_s, so with estimates a younger run goes instead
VICTIM_JOBS = [
    TraceJob(1, 0.0, 300.0, 1, "a", cpus_per_worker=1.0),
    TraceJob(2, 0.0, 330.0, 1, "a", cpus_per_worker=1.0),
    TraceJob(3, 0.0, 5000.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(4, 0.0, 5100.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(5, 1000.0, 5300.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(6, 5200.0, 9000.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(7, 5200.0, 9100.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(8, 5200.0, 9200.0, 2, "b", cpus_per_worker=1.0),
    TraceJob(9, 6000.0, 600.0, 2, "a", cpus_per_worker=1.0),
]
ESTIMATE_SEQUENCES = {"short-first": SHORT_FIRST_JOBS, "victims": VICTIM_JOBS}


@pytest.mark.parametrize("sequence", sorted(ESTIMATE_SEQUENCES))
@pytest.mark.parametrize("policy", ["fifo", "sjf", "las", "fair"])
def test_estimated_durations_from_measured_runs_decide_alike(
    policy: str, sequence: str, tmp_path: Path
) -> None:
    jobs = ESTIMATE_SEQUENCES[sequence]
    expected = simulate_realistic(policy, jobs, ESTIMATED)
    got, _ = drive_ticking_loop(policy, tmp_path, jobs, ESTIMATED)
    assert got == expected


@pytest.mark.parametrize(("policy", "sequence"), [("sjf", "short-first"), ("fair", "victims")])
def test_the_estimates_change_what_the_policy_decides(policy: str, sequence: str) -> None:
    """The sequences above are ones where the estimates matter: without them the same policy
    decides otherwise, so parity covers them."""
    jobs = ESTIMATE_SEQUENCES[sequence]
    with_estimates = simulate_realistic(policy, jobs, ESTIMATED)
    assert with_estimates != simulate_realistic(policy, jobs, REALISTIC)
    if policy == "fair":  # a younger run than job 5 goes
        victims = [t for _, what, t, _ in with_estimates if what == "preempt"]
        assert victims
        assert 5 not in victims
        assert 5 in [t for _, w, t, _ in simulate_realistic(policy, jobs) if w == "preempt"]
