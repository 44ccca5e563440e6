"""Replay the server's own history: its recorded arrivals and run times through any policy.

``trainhub sim --replay DB_URL`` reads every trial the database recorded (when it was
submitted, its shape, how long its processes ran, whether it was preempted) and re-runs them
in the simulator on any cluster and under any guarantees, next to what really happened,
measured the same way (JCT, waits, utilisation, each tenant's share of its guarantee). An
admin answers "what if we had 16 more GPUs" or "what if tenant X had guarantee 8" from their
own data.

What is replayed: trials that ended after their processes ran (their run time is known).
Trials that never ran, or still run, are counted as skipped. A slot is a GPU; on a CPU-only
server a CPU core is a slot, and the simulated nodes' "GPUs" stand for cores.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainhub.core.fairshare import scaled_guarantees
from trainhub.core.scheduling import TenantShare
from trainhub.core.spec import Priority, Resources
from trainhub.service.records import AttemptUsage, RecordedTrial
from trainhub.service.repository import UnitOfWork
from trainhub.sim.cluster import ClusterSpec
from trainhub.sim.engine import SimConfig
from trainhub.sim.ledger import TenantTimeline
from trainhub.sim.metrics import JobRecord, SimResult
from trainhub.sim.runner import simulate
from trainhub.sim.trace import TraceJob

ACTUAL = "actual"


@dataclass(frozen=True)
class History:
    """What a server's database recorded, ready to replay."""

    trials: list[RecordedTrial]  # the replayed ones
    attempts: list[AttemptUsage]  # their attempts' holdings (what really happened)
    tenants: dict[str, TenantShare]
    skipped: int = 0  # trials that never ran or have not ended
    start_s: float = 0.0  # the first replayed submission (time 0 of the replay)

    @property
    def jobs(self) -> list[TraceJob]:
        return [trace_job(t, self.start_s) for t in self.trials]


@dataclass(frozen=True)
class ReplayReport:
    history: History
    # what really happened first (policy "actual"), then one result per simulated policy
    results: list[SimResult] = field(default_factory=list)


def _shape(spec: Mapping[str, object]) -> Resources:
    return Resources.model_validate(spec.get("resources") or {})


def trace_job(trial: RecordedTrial, start_s: float) -> TraceJob:
    """One recorded trial as a trace job: arrival, slots per worker, recorded run time."""
    resources = _shape(trial.spec)
    per_worker = resources.gpus_per_worker or max(1, round(resources.cpus_per_worker))
    return TraceJob(
        job_id=trial.trial_id,
        submit_s=trial.submitted_at - start_s,
        duration_s=trial.run_time_s,
        num_gpus=resources.workers * per_worker,
        tenant=trial.tenant,
        priority=Priority(trial.priority),
        gpus_per_worker=per_worker,
        cpus_per_worker=resources.cpus_per_worker if resources.gpus_per_worker else 0.0,
        single_node=resources.single_node,
    )


def read_history(uow: UnitOfWork, since: float | None = None) -> History:
    """The trials (and their attempts) a server's database recorded since ``since``."""
    with uow() as repo:
        recorded = repo.trial_history(since)
        tenants = {
            t.name: TenantShare(t.guaranteed_slots, t.limit_slots, t.weight)
            for t in repo.list_tenants()
        }
        start = min((t.submitted_at for t in recorded), default=0.0)
        attempts = repo.attempt_usage(start - 1.0)
    replayed = [
        t for t in recorded if t.state.is_terminal and t.run_time_s > 0 and t.ended_at is not None
    ]
    ids = {t.trial_id for t in replayed}
    return History(
        trials=replayed,
        attempts=[a for a in attempts if a.trial_id in ids],
        tenants=tenants,
        skipped=len(recorded) - len(replayed),
        start_s=min((t.submitted_at for t in replayed), default=0.0),
    )


def actual_result(history: History, total_slots: int) -> SimResult:
    """What really happened, measured as the simulator measures a run (policy "actual")."""
    t0 = history.start_s
    jobs = {j.job_id: j for j in history.jobs}
    records = []
    for trial in history.trials:
        job = jobs[trial.trial_id]
        record = JobRecord(job.job_id, job.tenant, job.num_gpus, job.submit_s, job.duration_s)
        if trial.first_start_at is not None:
            record.first_start_s = trial.first_start_at - t0
        record.finish_s = (trial.ended_at or t0) - t0
        record.preemptions = trial.num_preemptions
        records.append(record)
    names = sorted({t.tenant for t in history.trials} | set(history.tenants))
    guarantees = scaled_guarantees(
        {t: history.tenants.get(t, TenantShare()).guaranteed_slots for t in names}, total_slots
    )
    timeline = TenantTimeline(names, guarantees, 0.0)
    # (time, order, tenant, held, demand): ends before starts at the same instant
    changes: list[tuple[float, int, str, int, int]] = []
    for record in records:
        changes.append((record.submit_s, 1, record.tenant, 0, record.num_gpus))
        changes.append((record.finish_s or 0.0, 0, record.tenant, 0, -record.num_gpus))
    busy = 0.0
    last = 0.0
    for attempt in history.attempts:
        end = (attempt.end if attempt.end is not None else t0) - t0
        changes.append((attempt.start - t0, 1, attempt.tenant, attempt.num_slots, 0))
        changes.append((end, 0, attempt.tenant, -attempt.num_slots, 0))
        busy += attempt.num_slots * max(0.0, end - (attempt.start - t0))
        last = max(last, end)
    for at, _, tenant, held, demand in sorted(changes):
        timeline.change(tenant, at, held=held, demand=demand)
        last = max(last, at)
    timeline.settle(last)
    return SimResult(
        policy=ACTUAL,
        records=records,
        rejected=[],
        total_gpus=total_slots,
        busy_gpu_s=busy,
        lost_gpu_s=0.0,
        passes=0,
        timeline=timeline,
        wall_s=0.0,
        idle_gpu_s=math.nan,  # not recorded
        span_s=last,
    )


def replay(
    history: History,
    cluster: ClusterSpec,
    policies: Sequence[str],
    *,
    guarantees: Mapping[str, int] | None = None,
    sim: SimConfig | None = None,
    actual_slots: int | None = None,
) -> ReplayReport:
    """What really happened, then each policy on ``cluster`` with the recorded arrivals and
    run times. ``guarantees`` overrides tenants' guaranteed slots ("what if X had 8");
    ``actual_slots`` is the real cluster's size (default: the simulated one's)."""
    tenants = dict(history.tenants)
    for name, slots in (guarantees or {}).items():
        share = tenants.get(name, TenantShare())
        limit = share.limit_slots if share.limit_slots is None else max(share.limit_slots, slots)
        tenants[name] = TenantShare(slots, limit, share.weight)
    results = [actual_result(history, actual_slots or cluster.total_gpus)]
    jobs = history.jobs
    for name in policies:
        results.append(simulate(jobs, cluster, name, tenants=tenants, sim=sim))
    return ReplayReport(history, results)
