"""Discrete-event simulation of a GPU cluster driven by a core scheduling policy.

Time jumps from event to event: arrivals, completions, preempted jobs leaving, and the
wake-up times a policy asks for (``DecisionList.wake_at``); a scheduling pass runs after the
events of each instant, only while something waits. The policy object is the one the control
plane runs: the simulator builds the same ``Snapshot`` and carries out the same decisions.

Preemption model: a ``Preempt`` gives the job ``checkpoint_time_s`` to save and exit, during
which it keeps its GPUs. Progress survives only up to the last periodic checkpoint
(``checkpoint_interval_s`` of productive time) unless ``save_on_preempt`` is set, and every
restart pays ``restart_overhead_s`` before making progress again.
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from trainhub.core.resources import Node
from trainhub.core.scheduling import (
    BasePolicy,
    QueuedTrial,
    RunningTrial,
    Snapshot,
    TenantShare,
    TrialQueue,
    split_decisions,
)
from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.nodetable import HOT_GPU_TEMPERATURE_C, NodeTable
from trainhub.core.scheduling.queue import shape_of
from trainhub.core.scheduling.runningtable import RunningTable
from trainhub.sim.cluster import ClusterSpec
from trainhub.sim.ledger import DecayedUsage, TenantTimeline
from trainhub.sim.metrics import JobRecord, SimResult
from trainhub.sim.trace import TraceJob

_FINISH, _RELEASE, _WAKE = 0, 1, 2


def _with_free(node: Node, gpus: int, cpus: float) -> Node:
    """``replace(node, free_gpus=..., free_cpus=...)`` without its per-call introspection."""
    new = object.__new__(Node)
    new.__dict__.update(node.__dict__, free_gpus=gpus, free_cpus=cpus)
    return new


class SimulationError(RuntimeError):
    """The policy broke its contract (partial gang, over-allocation, unknown trial)."""


@dataclass(frozen=True)
class SimConfig:
    """How the simulated cluster and jobs behave.

    Attributes:
        checkpoint_interval_s: productive time between two periodic checkpoints; 0 means a
            job never loses work.
        checkpoint_time_s: time a preempted job keeps its GPUs while it saves and exits.
        save_on_preempt: the job checkpoints when told to stop (no work lost); off by default
            (pessimistic: scripts that only checkpoint per epoch).
        restart_overhead_s: time a restarted job holds its GPUs before making progress.
        known_durations: show the policy each job's true remaining time as
            ``expected_duration_s`` (the SJF bound; an oracle for backfill).
        half_life_s: half-life of the decayed tenant usage handed to the policy.
        pass_interval_s: the least time between two scheduling passes, like the tick of a
            control loop: events closer to the last pass than this wait for a pass at the
            next tick. 0 runs a pass after every instant with events.
        max_passes: stop after this many scheduling passes (a guard against livelock).
    """

    checkpoint_interval_s: float = 1800.0
    checkpoint_time_s: float = 30.0
    save_on_preempt: bool = False
    restart_overhead_s: float = 60.0
    known_durations: bool = False
    half_life_s: float = 24 * 3600.0
    pass_interval_s: float = 0.0
    max_passes: int = 50_000_000

    def __post_init__(self) -> None:
        for name in (
            "checkpoint_interval_s",
            "checkpoint_time_s",
            "restart_overhead_s",
            "pass_interval_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.half_life_s <= 0:
            raise ValueError("half_life_s must be > 0")


class Simulator:
    """One run of one policy over one trace on one cluster."""

    def __init__(
        self,
        jobs: Sequence[TraceJob],
        cluster: ClusterSpec,
        policy: BasePolicy,
        tenants: Mapping[str, TenantShare] | None = None,
        config: SimConfig | None = None,
    ) -> None:
        self.jobs = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
        self.cluster = cluster
        self.policy = policy
        self.tenants = dict(tenants or {})
        self.config = config or SimConfig()

    def run(self) -> SimResult:
        wall = time.perf_counter()
        self._cpu_start = time.process_time()
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run(wall)
        finally:
            if collecting:
                gc.enable()

    def _run(self, wall: float) -> SimResult:
        cfg = self.config
        policy = self.policy
        hot = getattr(
            getattr(policy, "config", None), "hot_gpu_temperature_c", HOT_GPU_TEMPERATURE_C
        )
        nodes: dict[str, Node] = {spec.node_id: spec.node() for spec in self.cluster.nodes}
        free_g = {i: n.free_gpus for i, n in nodes.items()}
        free_c = {i: n.free_cpus for i, n in nodes.items()}
        table = NodeTable(nodes.values(), hot)
        changed: dict[str, Node] = {}
        fits_pool = NodePool(table, hot)

        jobs = self.jobs
        by_id = {j.job_id: j for j in jobs}
        requests = {j.job_id: j.request() for j in jobs}
        records = {
            j.job_id: JobRecord(j.job_id, j.tenant, j.num_gpus, j.submit_s, j.duration_s)
            for j in jobs
        }
        rejected = [
            j.job_id
            for j in jobs
            if not fits_pool.fits_empty(requests[j.job_id], shape_of(requests[j.job_id]))
        ]
        skip = set(rejected)
        arrivals = [j for j in jobs if j.job_id not in skip]
        remaining = {j.job_id: j.duration_s for j in arrivals}
        attained: dict[int, float] = {}
        preemptions: dict[int, int] = {}
        attempt: dict[int, int] = {}
        started_at: dict[int, float] = {}
        overhead: dict[int, float] = {}
        queued_objs: dict[int, QueuedTrial] = {}
        running: dict[int, RunningTrial] = {}
        table_running = RunningTable()
        run_changed: dict[int, RunningTrial] = {}
        run_removed: set[int] = set()
        queue = TrialQueue((), policy.queue_order)
        tenant_names = sorted({j.tenant for j in arrivals} | set(self.tenants))
        start = arrivals[0].submit_s if arrivals else 0.0
        timeline = TenantTimeline(
            tenant_names,
            {t: self.tenants.get(t, TenantShare()).guaranteed_slots for t in tenant_names},
            start,
        )
        usage = DecayedUsage(tenant_names, cfg.half_life_s, start)
        heap: list[tuple[float, int, int, int, int]] = []
        seq = 0
        next_wake = math.inf
        at_arrival = 0
        now = start
        last = now
        passes = 0
        last_pass = -math.inf
        lost_gpu_s = 0.0
        busy_gpu_s = 0.0
        held = 0
        total_gpus = self.cluster.total_gpus

        def enqueue(job_id: int, at: float) -> QueuedTrial:
            job = by_id[job_id]
            trial = QueuedTrial(
                trial_id=job_id,
                tenant=job.tenant,
                request=requests[job_id],
                priority=job.priority,
                queued_at=at,
                submitted_at=job.submit_s,
                expected_duration_s=remaining[job_id] if cfg.known_durations else None,
                attained_service=attained.get(job_id, 0.0),
            )
            queued_objs[job_id] = trial
            return trial

        def release_capacity(trial: RunningTrial, sign: int) -> None:
            g, c = trial.request.gpus_per_worker, trial.request.cpus_per_worker
            for node_id in trial.placement:
                free_g[node_id] += sign * g
                free_c[node_id] += sign * c
            for node_id in set(trial.placement):
                node = _with_free(nodes[node_id], free_g[node_id], free_c[node_id])
                nodes[node_id] = changed[node_id] = node

        while at_arrival < len(arrivals) or heap:
            t_arrival = arrivals[at_arrival].submit_s if at_arrival < len(arrivals) else math.inf
            t_event = heap[0][0] if heap else math.inf
            now = min(t_arrival, t_event)
            if now > last:
                busy_gpu_s += held * (now - last)
                last = now
            added: list[QueuedTrial] = []
            removed: list[QueuedTrial] = []
            while at_arrival < len(arrivals) and arrivals[at_arrival].submit_s <= now:
                job = arrivals[at_arrival]
                at_arrival += 1
                added.append(enqueue(job.job_id, now))
                timeline.change(job.tenant, now, demand=job.num_gpus)
            while heap and heap[0][0] <= now:
                _, _, kind, job_id, number = heapq.heappop(heap)
                if kind == _WAKE:
                    if next_wake <= now:
                        next_wake = math.inf
                    continue
                trial = running.get(job_id)
                if trial is None or attempt.get(job_id) != number:
                    continue
                del running[job_id]
                run_changed.pop(job_id, None)
                if job_id in table_running.by_id:
                    run_removed.add(job_id)
                release_capacity(trial, +1)
                slots = trial.request.num_slots
                held -= slots
                timeline.change(trial.tenant, now, held=-slots)
                usage.change(trial.tenant, now, -slots)
                ran = now - started_at[job_id]
                attained[job_id] = attained.get(job_id, 0.0) + slots * ran
                record = records[job_id]
                if kind == _FINISH:
                    record.finish_s = now
                    timeline.change(trial.tenant, now, demand=-slots)
                    continue
                productive = max(0.0, ran - overhead[job_id])
                saved = productive
                if not cfg.save_on_preempt and cfg.checkpoint_interval_s > 0:
                    saved = (
                        math.floor(productive / cfg.checkpoint_interval_s)
                        * cfg.checkpoint_interval_s
                    )
                saved = min(saved, remaining[job_id])
                remaining[job_id] -= saved
                lost_gpu_s += (productive - saved) * slots
                added.append(enqueue(job_id, now))
            if added:
                queue = queue.added(added)
            if not len(queue):
                continue
            if cfg.pass_interval_s and now < last_pass + cfg.pass_interval_s:
                tick = last_pass + cfg.pass_interval_s
                if tick < next_wake:
                    next_wake = tick
                    seq += 1
                    heapq.heappush(heap, (tick, seq, _WAKE, -1, 0))
                continue
            last_pass = now
            if changed:
                table = table.updated(changed)
                changed.clear()
            usage.now = now
            if run_changed or run_removed:
                table_running = table_running.updated(run_changed.values(), run_removed)
                run_changed.clear()
                run_removed.clear()
            snapshot = Snapshot(
                now=now,
                nodes=table,
                queue=queue,
                running=table_running,
                tenants=self.tenants,
                tenant_usage=usage,
            )
            passes += 1
            if passes > cfg.max_passes:
                raise SimulationError(f"more than {cfg.max_passes} scheduling passes")
            starts, preempts, wake_at = split_decisions(policy.decide(snapshot))
            for preempt in preempts:
                trial = running.get(preempt.trial_id)
                if trial is None or trial.preempting:
                    raise SimulationError(f"preempt of trial {preempt.trial_id}, not running")
                running[trial.trial_id] = run_changed[trial.trial_id] = replace(
                    trial, preempting=True
                )
                preemptions[trial.trial_id] = preemptions.get(trial.trial_id, 0) + 1
                records[trial.trial_id].preemptions += 1
                seq += 1
                heapq.heappush(
                    heap,
                    (
                        now + cfg.checkpoint_time_s,
                        seq,
                        _RELEASE,
                        trial.trial_id,
                        attempt[trial.trial_id],
                    ),
                )
            for decision in starts:
                job_id = decision.trial_id
                queued = queued_objs.pop(job_id, None)
                if queued is None:
                    raise SimulationError(f"start of trial {job_id}, which is not queued")
                request = requests[job_id]
                if len(decision.placement) != request.num_workers:
                    raise SimulationError(
                        f"trial {job_id}: {len(decision.placement)} ranks placed, "
                        f"gang has {request.num_workers}"
                    )
                number = attempt.get(job_id, 0) + 1
                cost = cfg.restart_overhead_s if number > 1 else 0.0
                trial = RunningTrial(
                    trial_id=job_id,
                    tenant=queued.tenant,
                    request=request,
                    placement=decision.placement,
                    priority=queued.priority,
                    started_at=now,
                    attained_service=attained.get(job_id, 0.0),
                    submitted_at=queued.submitted_at,
                    num_preemptions=preemptions.get(job_id, 0),
                    # progress (and so the work a preemption loses) counts from after the
                    # restart overhead; periodic checkpoints follow
                    last_checkpoint_at=now + cost,
                    checkpoint_every_s=cfg.checkpoint_interval_s or None,
                )
                release_capacity(trial, -1)
                for node_id in set(decision.placement):
                    if free_g[node_id] < 0 or free_c[node_id] < -1e-9:
                        raise SimulationError(f"trial {job_id} over-allocates node {node_id}")
                attempt[job_id] = number
                overhead[job_id] = cost
                started_at[job_id] = now
                end = now + cost + remaining[job_id]
                if cfg.known_durations:
                    trial = replace(trial, expected_duration_s=end - now)
                running[job_id] = run_changed[job_id] = trial
                held += request.num_slots
                timeline.change(trial.tenant, now, held=request.num_slots)
                usage.change(trial.tenant, now, request.num_slots)
                record = records[job_id]
                if record.first_start_s is None:
                    record.first_start_s = now
                removed.append(queued)
                seq += 1
                heapq.heappush(heap, (end, seq, _FINISH, job_id, number))
            if removed:
                queue = queue.removed(removed)
            if wake_at is not None and now < wake_at < next_wake:
                next_wake = wake_at
                seq += 1
                heapq.heappush(heap, (wake_at, seq, _WAKE, -1, 0))
            if not heap and at_arrival >= len(arrivals) and len(queue):
                break  # nothing will ever change: the rest can never start
        timeline.settle(last)
        return SimResult(
            policy=policy.name,
            records=[records[j.job_id] for j in jobs],
            rejected=rejected,
            total_gpus=total_gpus,
            busy_gpu_s=busy_gpu_s,
            lost_gpu_s=lost_gpu_s,
            passes=passes,
            timeline=timeline,
            wall_s=time.perf_counter() - wall,
            cpu_s=time.process_time() - self._cpu_start,
        )
