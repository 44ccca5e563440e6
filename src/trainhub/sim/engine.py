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

import heapq
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from trainhub.core.fairshare import DecayedUsage, scaled_guarantees
from trainhub.core.gcpause import collection_paused
from trainhub.core.resources import ResourceRequest, can_ever_fit
from trainhub.core.scheduling import BasePolicy, TenantShare, split_decisions
from trainhub.core.scheduling.view import DurationEstimates, SnapshotBuilder, TrialFacts
from trainhub.core.states import TrialState
from trainhub.sim.cluster import ClusterSpec
from trainhub.sim.idle import IdleWhileFits
from trainhub.sim.ledger import TenantTimeline
from trainhub.sim.metrics import JobRecord, SimResult
from trainhub.sim.trace import TraceJob

_FINISH, _RELEASE, _WAKE = 0, 1, 2


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
        estimated_durations: without ``known_durations``, show the policy the estimate the
            server makes (``DurationEstimates``: the median run time of finished jobs of the
            same user and project, else project, else user). Traces have no users: the
            tenant stands for the user and the tenant with the job's GPU count for the project.
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
    estimated_durations: bool = False
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
        with collection_paused():
            return self._run(wall)

    def _run(self, wall: float) -> SimResult:
        cfg = self.config
        policy = self.policy
        # the control loop's own snapshot builder: the policy sees the same view of the same facts
        builder = SnapshotBuilder.for_policy(policy)
        node_facts = [spec.facts() for spec in self.cluster.nodes]
        builder.set_nodes(node_facts)
        total_g = {n.node_id: n.total_gpus for n in node_facts}
        free_g = dict(total_g)
        free_c = {n.node_id: n.total_cpus for n in node_facts}
        free_m = {n.node_id: n.total_memory_gb for n in node_facts}

        jobs = self.jobs
        requests = {j.job_id: j.request() for j in jobs}
        records = {
            j.job_id: JobRecord(j.job_id, j.tenant, j.num_gpus, j.submit_s, j.duration_s)
            for j in jobs
        }
        nodes_now = [spec.node() for spec in self.cluster.nodes]
        # jobs share a few request shapes: one fit check per shape, not per job
        never: dict[tuple[object, ...], bool] = {}
        rejected = []
        for j in jobs:
            request = requests[j.job_id]
            key = _request_key(request)
            known = never.get(key)
            if known is None:
                known = never[key] = can_ever_fit(request, nodes_now) is not None
            if known:
                rejected.append(j.job_id)
        skip = set(rejected)
        arrivals = [j for j in jobs if j.job_id not in skip]
        by_id = {j.job_id: j for j in arrivals}
        remaining = {j.job_id: j.duration_s for j in arrivals}
        attained: dict[int, float] = {}
        preemptions: dict[int, int] = {}
        attempt: dict[int, int] = {}
        started_at: dict[int, float] = {}
        overhead: dict[int, float] = {}
        facts: dict[int, TrialFacts] = {}
        tenant_names = sorted({j.tenant for j in arrivals} | set(self.tenants))
        start = arrivals[0].submit_s if arrivals else 0.0
        # fairness is measured against the guarantees the policy can honour (scaled to fit)
        guarantees = scaled_guarantees(
            {t: self.tenants.get(t, TenantShare()).guaranteed_slots for t in tenant_names},
            self.cluster.total_gpus,
        )
        timeline = TenantTimeline(tenant_names, guarantees, start)
        usage = DecayedUsage(cfg.half_life_s, start, tenant_names)
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
        # GPU-time held while jobs still arrive: utilisation under the offered load
        last_arrival = arrivals[-1].submit_s if arrivals else start
        arriving_gpu_s = 0.0
        held = 0
        total_gpus = self.cluster.total_gpus
        idle = IdleWhileFits(free_g, free_c, free_m, start)

        estimates = DurationEstimates()

        def queued_facts(job_id: int, at: float) -> TrialFacts:
            job = by_id[job_id]
            made = TrialFacts(
                trial_id=job_id,
                tenant=job.tenant,
                state=TrialState.QUEUED,
                request=requests[job_id],
                priority=job.priority,
                queued_at=at,
                submitted_at=job.submit_s,
                attained_service=attained.get(job_id, 0.0),
                progress_s=job.duration_s - remaining[job_id],
                expected_duration_s=(
                    job.duration_s
                    if cfg.known_durations
                    else estimates.estimate(job.tenant, f"{job.tenant}:{job.num_gpus}")
                    if cfg.estimated_durations
                    else None
                ),
                num_preemptions=preemptions.get(job_id, 0),
            )
            facts[job_id] = made
            return made

        def hold(job_id: int, placement: tuple[str, ...], sign: int) -> None:
            request = requests[job_id]
            g, c, m = request.gpus_per_worker, request.cpus_per_worker, request.memory_gb_per_worker
            for node_id in placement:
                free_g[node_id] -= sign * g
                free_c[node_id] -= sign * c
                free_m[node_id] -= sign * m

        while at_arrival < len(arrivals) or heap:
            t_arrival = arrivals[at_arrival].submit_s if at_arrival < len(arrivals) else math.inf
            t_event = heap[0][0] if heap else math.inf
            now = min(t_arrival, t_event)
            if now > last:
                busy_gpu_s += held * (now - last)
                if last < last_arrival:
                    arriving_gpu_s += held * (min(now, last_arrival) - last)
                idle.advance(now)
                last = now
            changed: list[TrialFacts] = []
            gone: list[int] = []
            while at_arrival < len(arrivals) and arrivals[at_arrival].submit_s <= now:
                job = arrivals[at_arrival]
                at_arrival += 1
                changed.append(queued_facts(job.job_id, now))
                timeline.change(job.tenant, now, demand=job.num_gpus)
            while heap and heap[0][0] <= now:
                _, _, kind, job_id, number = heapq.heappop(heap)
                if kind == _WAKE:
                    if next_wake <= now:
                        next_wake = math.inf
                    continue
                trial = facts.get(job_id)
                if trial is None or not trial.state.is_active or attempt.get(job_id) != number:
                    continue
                hold(job_id, trial.placement, -1)
                slots = trial.request.num_slots
                held -= slots
                timeline.change(trial.tenant, now, held=-slots)
                usage.change(trial.tenant, now, -slots)
                ran = now - started_at[job_id]
                attained[job_id] = attained.get(job_id, 0.0) + slots * ran
                record = records[job_id]
                if kind == _FINISH:
                    record.finish_s = now
                    job = by_id[job_id]
                    estimates.add(job.tenant, f"{job.tenant}:{job.num_gpus}", job.duration_s)
                    timeline.change(trial.tenant, now, demand=-slots)
                    del facts[job_id]
                    gone.append(job_id)
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
                changed.append(queued_facts(job_id, now))
            if changed or gone:
                builder.update(changed, gone)
                idle.changed(builder.queue)
            if not builder.num_queued:
                continue
            if cfg.pass_interval_s and now < last_pass + cfg.pass_interval_s:
                tick = last_pass + cfg.pass_interval_s
                if tick < next_wake:
                    next_wake = tick
                    seq += 1
                    heapq.heappush(heap, (tick, seq, _WAKE, -1, 0))
                continue
            last_pass = now
            usage.now = now
            snapshot = builder.snapshot(now, self.tenants, usage)
            passes += 1
            if passes > cfg.max_passes:
                raise SimulationError(f"more than {cfg.max_passes} scheduling passes")
            starts, preempts, wake_at = split_decisions(policy.decide(snapshot))
            changed = []
            for preempt in preempts:
                trial = facts.get(preempt.trial_id)
                if trial is None or trial.state is not TrialState.RUNNING:
                    raise SimulationError(f"preempt of trial {preempt.trial_id}, not running")
                if not trial.preemptible:
                    raise SimulationError(f"preempt of trial {preempt.trial_id}, not preemptible")
                changed.append(replace(trial, state=TrialState.PREEMPTING))
                facts[trial.trial_id] = changed[-1]
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
                queued = facts.get(job_id)
                if queued is None or queued.state is not TrialState.QUEUED:
                    raise SimulationError(f"start of trial {job_id}, which is not queued")
                request = requests[job_id]
                if len(decision.placement) != request.num_workers:
                    raise SimulationError(
                        f"trial {job_id}: {len(decision.placement)} ranks placed, "
                        f"gang has {request.num_workers}"
                    )
                number = attempt.get(job_id, 0) + 1
                cost = cfg.restart_overhead_s if number > 1 else 0.0
                trial = replace(
                    queued,
                    state=TrialState.RUNNING,
                    placement=decision.placement,
                    attempt_started_at=now,
                    # progress (and so the work a preemption loses) counts from after the
                    # restart overhead; periodic checkpoints follow
                    last_checkpoint_at=now + cost,
                    checkpoint_every_s=cfg.checkpoint_interval_s or None,
                )
                hold(job_id, decision.placement, +1)
                for node_id in set(decision.placement):
                    if free_g[node_id] < 0 or free_c[node_id] < -1e-9 or free_m[node_id] < -1e-9:
                        raise SimulationError(f"trial {job_id} over-allocates node {node_id}")
                attempt[job_id] = number
                overhead[job_id] = cost
                started_at[job_id] = now
                end = now + cost + remaining[job_id]
                facts[job_id] = trial
                changed.append(trial)
                held += request.num_slots
                timeline.change(trial.tenant, now, held=request.num_slots)
                usage.change(trial.tenant, now, request.num_slots)
                record = records[job_id]
                if record.first_start_s is None:
                    record.first_start_s = now
                seq += 1
                heapq.heappush(heap, (end, seq, _FINISH, job_id, number))
            if changed:
                builder.update(changed)
                idle.changed(builder.queue)
            if wake_at is not None and now < wake_at < next_wake:
                next_wake = wake_at
                seq += 1
                heapq.heappush(heap, (wake_at, seq, _WAKE, -1, 0))
            if not heap and at_arrival >= len(arrivals) and builder.num_queued:
                break  # nothing will ever change: the rest can never start
        idle.advance(last)
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
            idle_gpu_s=idle.idle_gpu_s,
            arriving_gpu_s=arriving_gpu_s,
            arriving_s=last_arrival - start,
            span_s=last - start,
            cpu_s=time.process_time() - self._cpu_start,
        )


def _request_key(request: ResourceRequest) -> tuple[object, ...]:
    """A hashable key of everything about a request that decides where it can fit."""
    return (
        request.num_workers,
        request.gpus_per_worker,
        request.cpus_per_worker,
        request.placement,
        request.single_node,
        tuple(sorted(request.node_labels.items())),
        request.memory_gb_per_worker,
    )
