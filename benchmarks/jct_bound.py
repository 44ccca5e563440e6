"""Issue 27: how low can the average JCT go with every tenant's guarantee kept? A measurement.

Reference orders, none shipped (they exist to measure the fair policy on a cell against):
two that keep every tenant's guarantee and order the rest for JCT, and two variants of the
fair policy itself. The guarantee is kept as admission keeps it (a gang admitted inside its
tenant's guarantee may still not fit at once): each line's ``min_share`` says how well.

- ``gfirst-las``: guarantee-first least-attained-service. Each pass admits, first, every
  tenant's own jobs (running and queued, in the LAS order: service level, then submission)
  while the tenant holds less than its guarantee (the fair policy's ``entitled`` rule: its
  next job may take it past the guarantee once); then everything left in one global LAS
  order while GPUs remain. A running job not admitted is preempted when an admitted queued
  job does not fit, as in LAS (``LeastAttainedServicePolicy``), so a job inside its tenant's
  guarantee is never preempted for a borrower, and borrowed capacity goes to the jobs with the
  least attained service, whoever's they are. It is LAS with the guarantee as a hard
  constraint, at LAS's churn.
- ``gfirst-las-budget``: ``gfirst-las`` with its preemptions drawn from a budget that each
  arriving job adds ``--preemptions-per-job`` to (0.2, issue 27's target), up to
  ``--budget-cap`` preemptions; a pass preempts the outranked running jobs with the most
  attained service first, as many as the budget holds. Whether a duration-free order that
  keeps the guarantees reaches FIFO's average JCT within the preemption target.
- ``gfirst-las-displace-budget``: the same, but a pass where a job admitted inside its
  tenant's guarantee does not fit preempts without the budget (reclaims are not bounded;
  only displacement of borrowed capacity for less attained service is).
- ``gfirst-srpt``: the same with the shortest remaining time first (the true durations, an
  oracle no server has) in place of the least attained service: SRPT with the guarantee as
  a hard constraint.
- ``fair-borrow-fifo``: the fair policy with one change: borrowers (tenants at or above their
  guarantee) are served in the order of their next job's submission instead of by fair-share
  score, so borrowed capacity goes first come, first served across tenants, as under FIFO.
- ``fair-borrow-estimate``: the same, borrowers ordered by their next job's expected duration
  (the estimate the server makes, ``SimConfig.estimated_durations``): shortest first.

    PYTHONPATH=src .venv/bin/python benchmarks/jct_bound.py --nodes 128 --load 1.0 \
        --traces-dir ../shared/traces

One JSON line per policy (``sim.sweep.cell_lines``' keys, ratios against FIFO and LAS on the
same window); with ``--per-tenant`` one per tenant: jobs, GPU-hours, guarantee, the GPUs its
jobs offer in each quarter of the arrival span, and each policy's average JCT, average wait and
share; with ``--overtaking TENANT`` one per policy: the GPU-hours other tenants started, owed
(below their guarantee) or borrowing, while an earlier job of TENANT waited. Not part of the
test run.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import math
import sys
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from trainhub.core.scheduling import LasConfig, TenantShare, create_policy
from trainhub.core.scheduling.decisions import DecisionList, Pending, Preempt, Reason, Start
from trainhub.core.scheduling.fair import FairSharePolicy, TenantKey, _FairPass, entitled
from trainhub.core.scheduling.las import LeastAttainedServicePolicy
from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.queue import (
    OrderKey,
    QueueOrder,
    RunView,
    Shape,
    TrialQueue,
    shape_of,
)
from trainhub.core.scheduling.reasons import ReasonBook
from trainhub.core.scheduling.snapshot import QueuedTrial, RunningTrial, Snapshot
from trainhub.sim import engine
from trainhub.sim.cluster import ClusterSpec
from trainhub.sim.engine import SimConfig, Simulator
from trainhub.sim.ledger import TenantTimeline
from trainhub.sim.runner import guarantees_from_demand
from trainhub.sim.sweep import cell_lines
from trainhub.sim.trace import TraceJob

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scheduler import _name, _window


class GuaranteeFirstLas(LeastAttainedServicePolicy):
    """LAS with each tenant's guarantee admitted first (see the module's docstring)."""

    name = "gfirst-las"
    owed_blocked = False  # the last pass: a job admitted inside its tenant's guarantee waits

    def decide(self, snapshot: Snapshot) -> DecisionList:
        now = snapshot.now
        queue = TrialQueue.coerce(snapshot.queue, self.queue_order)
        pool = NodePool(snapshot.nodes)
        book = ReasonBook(snapshot.nodes, pool)
        budget = sum(n.total_gpus for n in pool.nodes.values())
        old_enough = now - self.config.min_run_time_s
        # segments per tenant (a group cut by service level; LAS._segments, kept by tenant)
        levels = self._levels()
        segments: list[RunView] = []
        owner: list[str] = []
        for (tenant, _, _), trials in queue.groups.items():
            if trials.first.request.gpus_per_worker == 0:
                raise ValueError("gfirst-las measures GPU traces only")
            bounds = [trials.bisect_left((float(level),)) for level in range(1, levels)]
            edges = [0, *bounds, len(trials)]
            for lo, hi in pairwise(edges):
                if hi > lo:
                    segments.append(trials.view(lo, hi))
                    owner.append(tenant)
        at = [0] * len(segments)
        running = [t for t in snapshot.running if not t.preempting]
        ranked = [self._running_rank(t, now) for t in running]
        sinks = [sink for _, _, sink in ranked if sink is not None]
        run_rank = {trial.trial_id: rank for trial, rank, _ in ranked}
        admitted_run: set[int] = set()
        # (trial, segment, admitted inside its tenant's guarantee)
        admitted: list[tuple[QueuedTrial, int, bool]] = []

        def head(i: int) -> tuple[tuple[float, float, int], QueuedTrial] | None:
            if at[i] >= len(segments[i]):
                return None
            trial = segments[i][at[i]]
            return self._queued_rank(trial, now), trial

        # phase 1: per tenant, its own LAS order while it holds less than its guarantee
        by_tenant_run: dict[str, list[RunningTrial]] = {}
        for t in running:
            by_tenant_run.setdefault(t.tenant, []).append(t)
        by_tenant_seg: dict[str, list[int]] = {}
        for i, tenant in enumerate(owner):
            by_tenant_seg.setdefault(tenant, []).append(i)
        shares = snapshot.tenants
        for tenant in sorted(set(by_tenant_run) | set(by_tenant_seg)):
            guarantee = shares.get(tenant, TenantShare()).guaranteed_slots
            used = 0
            runs = sorted(by_tenant_run.get(tenant, []), key=lambda t: run_rank[t.trial_id])
            r = 0
            heap: list[tuple[tuple[float, float, int], int, QueuedTrial]] = []
            for i in by_tenant_seg.get(tenant, []):
                h = head(i)
                if h is not None:
                    heap.append((h[0], i, h[1]))
            heapq.heapify(heap)
            while entitled(used, 0, guarantee) and (r < len(runs) or heap):
                if r < len(runs) and (not heap or run_rank[runs[r].trial_id] < heap[0][0]):
                    trial = runs[r]
                    r += 1
                    slots = trial.request.num_slots
                    if budget >= slots or not trial.preemptible or trial.started_at > old_enough:
                        budget -= slots
                        used += slots
                        admitted_run.add(trial.trial_id)
                    continue
                _, i, queued = heapq.heappop(heap)
                slots = queued.request.num_slots
                if budget < slots:
                    break
                budget -= slots
                used += slots
                admitted.append((queued, i, True))
                at[i] += 1
                h = head(i)
                if h is not None:
                    heapq.heappush(heap, (h[0], i, h[1]))
        # phase 2: everything left, one LAS order
        rest = sorted((run_rank[t.trial_id], t) for t in running if t.trial_id not in admitted_run)
        evictable: list[Preempt] = []
        heap = []
        for i in range(len(segments)):
            h = head(i)
            if h is not None:
                heap.append((h[0], i, h[1]))
        heapq.heapify(heap)
        lazy: list[tuple[Sequence[QueuedTrial], int, Reason]] = []
        r = 0
        while r < len(rest) or heap:
            if r < len(rest) and (not heap or rest[r][0] < heap[0][0]):
                trial = rest[r][1]
                r += 1
                slots = trial.request.num_slots
                if budget >= slots or not trial.preemptible or trial.started_at > old_enough:
                    budget -= slots
                else:
                    evictable.append(Preempt(trial.trial_id, "gfirst-las: outranked"))
                continue
            _, i, queued = heapq.heappop(heap)
            if budget >= queued.request.num_slots and budget >= 1:
                budget -= queued.request.num_slots
                admitted.append((queued, i, False))
                at[i] += 1
                h = head(i)
                if h is not None:
                    heapq.heappush(heap, (h[0], i, h[1]))
            else:
                lazy.append((segments[i], at[i], book.waiting))
        starts: list[Start] = []
        blocked = False
        refused: dict[Shape, Reason] = {}
        self.owed_blocked = False
        for queued, _, owed in admitted:
            request = queued.request
            shape = shape_of(request)
            reason = refused.get(shape)
            if reason is None:
                ranks = pool.place(request)
                if ranks is not None:
                    starts.append(Start(queued.trial_id, ranks))
                    pool.take(request, ranks)
                    book.started(request, ranks)
                    continue
                blocked = blocked or pool.fits_empty(request, shape)
                self.owed_blocked |= owed and pool.fits_empty(request, shape)
                reason = book.waiting if pool.fits_empty(request, shape) else book.never
                refused[shape] = reason
            lazy.append(((queued,), 0, reason))
        preempts = evictable if blocked else []
        pending: list[Pending] = []
        return DecisionList(
            starts, preempts, pending, lazy, self._wake_at(snapshot, segments, sinks)
        )

    def _levels(self) -> int:
        return len(self.config.thresholds_slot_s) + 1

    def _running_rank(
        self, trial: RunningTrial, now: float
    ) -> tuple[RunningTrial, tuple[float, float, int], tuple[float, int] | None]:
        ranked = self._rank_running(trial, now)
        return trial, ranked.entry[:3], ranked.sink


class GuaranteeFirstLasBudget(GuaranteeFirstLas):
    """``gfirst-las`` whose preemptions spend a budget that arrivals refill (see the module's
    docstring): at most ``per_job`` preemptions per job over a run, plus ``cap``."""

    def __init__(self, per_job: float, cap: float, budget_reclaims: bool = True) -> None:
        super().__init__(LasConfig())
        self.name = "gfirst-las-budget" if budget_reclaims else "gfirst-las-displace-budget"
        self.budget_reclaims = budget_reclaims
        self.per_job = per_job
        self.cap = cap
        self.budget = cap
        self._seen: set[int] = set()

    def decide(self, snapshot: Snapshot) -> DecisionList:
        arrived = [t.trial_id for t in snapshot.queue if t.trial_id not in self._seen]
        self._seen.update(arrived)
        self.budget = min(self.cap, self.budget + self.per_job * len(arrived))
        decided = super().decide(snapshot)
        if self.owed_blocked and not self.budget_reclaims:
            return decided  # a reclaim for a job inside its tenant's guarantee: not budgeted
        allowed = int(self.budget)
        if len(decided.preempts) <= allowed:
            self.budget -= len(decided.preempts)
            return decided
        # the outranked jobs come in LAS order: the most attained service is last
        kept = decided.preempts[len(decided.preempts) - allowed :] if allowed else ()
        self.budget -= len(kept)
        decided.preempts = kept
        return decided


class GuaranteeFirstSrpt(GuaranteeFirstLas):
    """``gfirst-las`` with the shortest remaining time first instead of the least attained
    service (the true durations: run it with ``known_durations``), an oracle reference."""

    name = "gfirst-srpt"
    reads_queued_durations = True
    reads_running_durations = True

    def __init__(self) -> None:
        super().__init__(LasConfig(promote_factor=0.0))
        self.queue_order = QueueOrder("srpt", self._srpt_key)

    @staticmethod
    def _srpt_key(trial: QueuedTrial) -> OrderKey:
        left = trial.expected_duration_s
        return (math.inf if left is None else left, trial.submitted_at, trial.trial_id)

    def _queued_rank(self, trial: QueuedTrial, now: float) -> tuple[float, float, int]:
        return self._srpt_key(trial)

    def _levels(self) -> int:
        return 1

    def _running_rank(
        self, trial: RunningTrial, now: float
    ) -> tuple[RunningTrial, tuple[float, float, int], tuple[float, int] | None]:
        left = trial.expected_duration_s
        if left is not None:
            left = max(0.0, left - (now - trial.started_at))
        return trial, (math.inf if left is None else left, trial.submitted_at, trial.trial_id), None


class _BorrowOrderPass(_FairPass):
    """A fair pass whose borrowers are ordered by ``by``: ``submitted`` (their next job's
    submission) or ``estimate`` (their next job's expected duration, the server's estimate);
    tenants owed or patient are served as before."""

    by = "submitted"

    def _push(self, tenant: Any) -> None:
        before = len(self.heap)
        super()._push(tenant)
        if len(self.heap) == before:
            return
        for k, (key, name) in enumerate(self.heap):
            if name != tenant.name or key.standing != 2:
                continue
            if self.by == "submitted":
                score = 0.0
            else:
                top = self._top(tenant)
                assert top is not None
                expected = top[1].head.expected_duration_s
                score = math.inf if expected is None else expected
            self.heap[k] = (TenantKey(key.standing, key.service, score, 0, 0, *key[5:]), name)
            heapq.heapify(self.heap)
            break


class _BorrowEstimatePass(_BorrowOrderPass):
    by = "estimate"


class FairBorrowOrder(FairSharePolicy):
    """The fair policy, borrowers served by their next job's submission or expected duration
    (measurement only)."""

    def __init__(self, by: str) -> None:
        super().__init__()
        self.name = f"fair-borrow-{'fifo' if by == 'submitted' else 'estimate'}"
        self.reads_queued_durations = by != "submitted"
        self.pass_type = _BorrowOrderPass if by == "submitted" else _BorrowEstimatePass

    def decide(self, snapshot: Snapshot) -> DecisionList:
        return self.pass_type(self, snapshot).run()


def _policy(name: str, per_job: float = 0.2, cap: float = 8.0) -> Any:
    if name == "gfirst-las":
        return GuaranteeFirstLas(LasConfig())
    if name == "gfirst-las-budget":
        return GuaranteeFirstLasBudget(per_job, cap)
    if name == "gfirst-las-displace-budget":
        return GuaranteeFirstLasBudget(per_job, cap, budget_reclaims=False)
    if name == "gfirst-srpt":
        return GuaranteeFirstSrpt()
    if name == "fair-borrow-fifo":
        return FairBorrowOrder("submitted")
    if name == "fair-borrow-estimate":
        return FairBorrowOrder("estimate")
    return create_policy(name)


def offered_by_quarter(jobs: Sequence[TraceJob], tenant: str) -> list[int]:
    """The GPUs ``tenant``'s jobs would hold on an unbounded cluster, on average over each
    quarter of the window's arrival span (``sim.sweep.offered_load``, per quarter)."""
    first = min(j.submit_s for j in jobs)
    span = max(j.submit_s for j in jobs) - first
    out = []
    for k in range(4):
        lo, hi = first + span * k / 4, first + span * (k + 1) / 4
        held = sum(
            j.num_gpus * max(0.0, min(j.submit_s + j.duration_s, hi) - max(j.submit_s, lo))
            for j in jobs
            if j.tenant == tenant and j.submit_s < hi
        )
        out.append(round(held / (hi - lo)))
    return out


def overtaking(
    jobs: Sequence[TraceJob],
    cluster: ClusterSpec,
    tenants: dict[str, TenantShare],
    name: str,
    who: str,
) -> dict[str, object]:
    """The starts of other tenants' jobs while a job of ``who`` submitted before them waits
    for its first start, by whether the starting tenant held less than its guarantee then
    (``owed``) or not (``borrowing``): how many, and the GPU-hours of run time they had left.
    With them, over the time ``who`` has GPUs asked for and not held (queued jobs), the GPUs
    held on average by ``who``, by the other tenants inside their guarantees and past them,
    and idle. The simulator's start step and its ledger are wrapped for the run (a
    measurement, never a decision)."""
    starts: list[tuple[float, int, str, float, float, int]] = []
    changes: list[tuple[float, str, float, float]] = []
    plain = engine._Run._start
    plain_change = TenantTimeline.change

    def _change(
        timeline: TenantTimeline, tenant: str, now: float, held: float = 0.0, demand: float = 0.0
    ) -> None:
        changes.append((now, tenant, held, demand))
        plain_change(timeline, tenant, now, held, demand)

    def _start(run: Any, decision: Start, now: float) -> Any:
        state = run.states[decision.trial_id]
        held = run.timeline._accounts[state.job.tenant].held
        out = plain(run, decision, now)
        gpu_h = state.request.num_slots * state.remaining_s / 3600
        starts.append((now, decision.trial_id, state.job.tenant, held, gpu_h, state.attempt))
        return out

    engine._Run._start = _start  # type: ignore[method-assign]
    TenantTimeline.change = _change  # type: ignore[method-assign]
    try:
        sim = SimConfig(estimated_durations=True)
        result = Simulator(jobs, cluster, _policy(name), tenants, sim).run()
    finally:
        engine._Run._start = plain  # type: ignore[method-assign]
        TenantTimeline.change = plain_change  # type: ignore[method-assign]
    guarantee = {t: s.guaranteed_slots for t, s in tenants.items()}
    held_now: dict[str, float] = {}
    asked: dict[str, float] = {}
    area = {"own": 0.0, "others_within_guarantee": 0.0, "others_past_guarantee": 0.0, "idle": 0.0}
    waited_s = 0.0
    last = changes[0][0] if changes else 0.0
    for now, tenant, held, demand in changes:
        dt = now - last
        if dt > 0 and asked.get(who, 0.0) > held_now.get(who, 0.0):
            waited_s += dt
            area["own"] += held_now.get(who, 0.0) * dt
            for other, h in held_now.items():
                if other != who:
                    g = guarantee.get(other, 0)
                    area["others_within_guarantee"] += min(h, g) * dt
                    area["others_past_guarantee"] += max(0.0, h - g) * dt
            area["idle"] += (cluster.total_gpus - sum(held_now.values())) * dt
        last = now
        held_now[tenant] = held_now.get(tenant, 0.0) + held
        asked[tenant] = asked.get(tenant, 0.0) + demand
    submitted = {j.job_id: j.submit_s for j in jobs}
    mine = sorted(
        (r.submit_s, r.first_start_s if r.first_start_s is not None else math.inf)
        for r in result.records
        if r.tenant == who
    )
    gpu_h: dict[str, float] = {}
    count: dict[str, int] = {}
    for now, job_id, tenant, held, left_h, attempt in starts:
        if tenant == who:
            continue
        before = mine[: bisect.bisect_left(mine, (submitted[job_id], -math.inf))]
        if not any(first > now for _, first in before):
            continue
        kind = "owed" if held < tenants[tenant].guaranteed_slots else "borrowing"
        key = f"{kind}{'-restart' if attempt > 1 else ''}:{tenant}"
        gpu_h[key] = gpu_h.get(key, 0.0) + left_h
        count[key] = count.get(key, 0) + 1
    totals: dict[str, float] = {}
    for key, value in gpu_h.items():
        kind = key.split(":", 1)[0]
        totals[kind] = totals.get(kind, 0.0) + value
    return {
        "policy": name,
        "waiting_tenant": who,
        "overtaking_gpu_h": {k: round(v) for k, v in sorted(totals.items())},
        "overtaking_starts": sum(count.values()),
        "hours_with_jobs_waiting": round(waited_s / 3600, 2),
        "gpus_held_meanwhile": {k: round(v / waited_s, 1) for k, v in area.items()}
        if waited_s
        else {},
        "by_tenant_gpu_h": {
            k: round(v) for k, v in sorted(gpu_h.items(), key=lambda kv: -kv[1]) if v >= 1
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="philly", choices=("philly", "openb"))
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--load", type=float, default=1.0)
    parser.add_argument(
        "--policy",
        action="append",
        choices=(
            "fifo",
            "fair",
            "las",
            "sjf",
            "gfirst-las",
            "gfirst-las-budget",
            "gfirst-las-displace-budget",
            "gfirst-srpt",
            "fair-borrow-fifo",
            "fair-borrow-estimate",
        ),
    )
    parser.add_argument("--traces-dir", type=Path, default=None)
    parser.add_argument("--preemptions-per-job", type=float, default=0.2)
    parser.add_argument("--budget-cap", type=float, default=8.0)
    parser.add_argument(
        "--reuse-baselines",
        type=Path,
        default=None,
        help="benchmarks/scheduler.py's folder of FIFO and LAS summaries per cell (same code)",
    )
    parser.add_argument("--per-tenant", action="store_true", help="also the per-tenant lines")
    parser.add_argument(
        "--overtaking",
        metavar="TENANT",
        default=None,
        help="also, per policy run, the other tenants' starts ahead of TENANT's waiting jobs",
    )
    args = parser.parse_args(argv)
    cluster, jobs = _window(args.trace, args.nodes, args.load, 8, 0.4, args.traces_dir)
    tenants = guarantees_from_demand(jobs, cluster.total_gpus)
    sim = SimConfig(estimated_durations=True)
    names = list(dict.fromkeys(["fifo", "las", *(args.policy or ["gfirst-las"])]))
    summaries = []
    records = {}
    for name in names:
        cell_name = _name(args.trace, args.nodes, args.load, 0.4)
        kept = args.reuse_baselines / f"{cell_name}.{name}.json" if args.reuse_baselines else None
        records_needed = args.per_tenant or args.overtaking
        if kept is not None and kept.exists() and name in ("fifo", "las") and not records_needed:
            summaries.append(json.loads(kept.read_text()))
            continue
        oracle = name in ("sjf", "gfirst-srpt")
        run_sim = sim if not oracle else SimConfig(estimated_durations=True, known_durations=True)
        policy = _policy(name, args.preemptions_per_job, args.budget_cap)
        result = Simulator(jobs, cluster, policy, tenants, run_sim).run()
        summary = result.summary()
        summary["policy"] = name
        summaries.append(summary)
        records[name] = (result.records, result.timeline.ratios())
    cell = _name(args.trace, args.nodes, args.load, 0.4)
    for line in cell_lines(cell, summaries, "test"):
        print(json.dumps(line), flush=True)
    if args.per_tenant:
        for tenant in sorted(tenants, key=lambda t: -sum(j.tenant == t for j in jobs)):
            mine = [j for j in jobs if j.tenant == tenant]
            line: dict[str, object] = {
                "cell": cell,
                "tenant": tenant,
                "jobs": len(mine),
                "gpu_h": round(sum(j.num_gpus * j.duration_s for j in mine) / 3600, 1),
                "guarantee": tenants[tenant].guaranteed_slots,
                "offered_gpus_by_quarter": offered_by_quarter(jobs, tenant),
            }
            for name, (recs, ratios) in records.items():
                done = [r for r in recs if r.tenant == tenant and r.finish_s is not None]
                jct = sum(r.jct_s or 0.0 for r in done) / len(done) if done else math.nan
                wait = (
                    sum(r.queueing_delay_s or 0.0 for r in done) / len(done) if done else math.nan
                )
                line[f"{name}_avg_jct_s"] = round(jct)
                line[f"{name}_avg_wait_s"] = round(wait)
                line[f"{name}_share"] = round(ratios.get(tenant, math.nan), 4)
            print(json.dumps(line), flush=True)
    if args.overtaking is not None:
        for name in names:
            if name not in ("sjf", "gfirst-srpt"):
                print(
                    json.dumps(
                        {"cell": cell, **overtaking(jobs, cluster, tenants, name, args.overtaking)}
                    )
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
