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

Durations are unknown to both (the simulator without ``known_durations``, the server without
enough completed trials to estimate): the server's estimates come from its own history, which
a trace does not have.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
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


def simulate(name: str, jobs: Sequence[TraceJob] = JOBS, patience: bool = True) -> Log:
    recorder = make_policy(name, patience)
    config = SimConfig(
        checkpoint_interval_s=0.0,
        checkpoint_time_s=CHECKPOINT_TIME_S,
        save_on_preempt=True,
        restart_overhead_s=0.0,
        half_life_s=HALF_LIFE_S,
    )
    Simulator(jobs, CLUSTER, recorder, TENANTS, config).run()
    return recorder.log


def spec_of(job: TraceJob) -> str:
    return (
        f"name: job-{job.job_id}\nentrypoint: sleep 1\n"
        f"resources: {{workers: {job.num_gpus}, gpus_per_worker: 1, cpus_per_worker: 1}}\n"
    )


def drive_control_loop(name: str, root: Path, jobs: Sequence[TraceJob] = JOBS) -> Log:
    recorder = make_policy(name)
    config = LoopConfig(
        "http://127.0.0.1:1",
        usage_half_life_s=HALF_LIFE_S,
        stop_wait_s=math.inf,  # the simulated scripts stop on should_stop(), never by SIGTERM
        estimate_min_samples=10**9,
    )
    h = LoopHarness(root, recorder, [n.node() for n in CLUSTER.nodes], config)
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
