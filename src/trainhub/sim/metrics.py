"""What a simulation measured, and the summary statistics reported for it.

Fairness is measured against guarantees, over time: at every instant a tenant is *entitled* to
``min(guarantee, demand)`` GPUs (demand: the GPUs of its queued and running jobs) and
*receives* ``min(held, entitled)``, where borrowing beyond the entitlement does not count. A
tenant's ratio is its received GPU-time over its entitled GPU-time for the whole run; 1.0 means
it always had its guarantee (or all it asked for) whenever it wanted it. Jain's index is taken
over the ratios of the tenants that were entitled to anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from trainhub.core.fairshare import jain_index
from trainhub.sim.ledger import TenantTimeline


@dataclass
class JobRecord:
    job_id: int
    tenant: str
    num_gpus: int
    submit_s: float
    duration_s: float
    first_start_s: float | None = None
    finish_s: float | None = None
    preemptions: int = 0

    @property
    def jct_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.submit_s

    @property
    def queueing_delay_s(self) -> float | None:
        return None if self.first_start_s is None else self.first_start_s - self.submit_s


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100) of ``values``; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass
class SimResult:
    policy: str
    records: list[JobRecord]
    rejected: list[int]
    total_gpus: int
    busy_gpu_s: float
    lost_gpu_s: float
    passes: int
    timeline: TenantTimeline
    wall_s: float
    # CPU time of the simulating process (the wall time depends on what else runs)
    cpu_s: float = 0.0
    # GPU-time idle while a waiting trial would have fit on it (trainhub.sim.idle)
    idle_gpu_s: float = 0.0
    # simulated time from the first arrival to the last event
    span_s: float = 0.0
    # GPU-time held, and simulated time, from the first arrival to the last one
    arriving_gpu_s: float = 0.0
    arriving_s: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        done = [r for r in self.records if r.finish_s is not None]
        jct = [r.jct_s for r in done if r.jct_s is not None]
        delay = [r.queueing_delay_s for r in done if r.queueing_delay_s is not None]
        delay_1gpu = [
            r.queueing_delay_s for r in done if r.num_gpus == 1 and r.queueing_delay_s is not None
        ]
        rejected = set(self.rejected)
        submitted = [r.submit_s for r in self.records if r.job_id not in rejected]
        finished = [r.finish_s for r in done if r.finish_s is not None]
        makespan = (max(finished) - min(submitted)) if finished and submitted else 0.0
        capacity = self.total_gpus * makespan
        ratios = self.timeline.ratios()
        slowdown = [
            r.jct_s / r.duration_s for r in done if r.jct_s is not None and r.duration_s > 0
        ]
        by_tenant: dict[str, list[float]] = {}
        for r in done:
            if r.jct_s is not None:
                by_tenant.setdefault(r.tenant, []).append(r.jct_s)
        return {
            "policy": self.policy,
            "jobs": len(self.records),
            "completed": len(done),
            "unfinished": len(self.records) - len(done) - len(self.rejected),
            "rejected": len(self.rejected),
            "avg_jct_s": _mean(jct),
            "median_jct_s": percentile(jct, 50),
            "p99_jct_s": percentile(jct, 99),
            # JCT over run time, per job (1: no waiting)
            "p99_slowdown": percentile(slowdown, 99),
            # every tenant's average JCT, and the tenants whose demand stayed within their
            # guarantee (a guarantee must never leave them worse off than FIFO)
            "tenant_avg_jct_s": {t: _mean(v) for t, v in sorted(by_tenant.items())},
            "within_guarantee": self.timeline.within_guarantee(),
            "avg_queueing_s": _mean(delay),
            "median_queueing_s": percentile(delay, 50),
            "p99_queueing_s": percentile(delay, 99),
            "p99_queueing_1gpu_s": percentile(delay_1gpu, 99),
            "makespan_s": makespan,
            "utilisation": self.busy_gpu_s / capacity if capacity else math.nan,
            "preemptions": sum(r.preemptions for r in self.records),
            "preemptions_per_job": (
                sum(r.preemptions for r in self.records) / len(done) if done else math.nan
            ),
            "utilisation_while_arriving": (
                self.arriving_gpu_s / (self.total_gpus * self.arriving_s)
                if self.arriving_s
                else math.nan
            ),
            "idle_while_fits": (
                self.idle_gpu_s / (self.total_gpus * self.span_s) if self.span_s else 0.0
            ),
            "lost_gpu_h": self.lost_gpu_s / 3600.0,
            "fairness_min_ratio": min(ratios.values()) if ratios else math.nan,
            "fairness_jain": jain_index(ratios) if ratios else math.nan,
            "tenant_ratios": {t: round(r, 4) for t, r in sorted(ratios.items())},
            "passes": self.passes,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            # what the run measured besides (topology: spans and fragmentation)
            "extra": dict(self.extra),
        }
