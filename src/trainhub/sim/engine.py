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

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from trainhub.core.entitlement import EntitlementLedger
from trainhub.core.fairshare import DecayedUsage, scaled_guarantees
from trainhub.core.gcpause import collection_paused
from trainhub.core.resources import Node, ResourceRequest, can_ever_fit
from trainhub.core.scheduling import BasePolicy, Start, TenantShare, split_decisions
from trainhub.core.scheduling.view import FINISHED_RUNS_READ, SnapshotBuilder, TrialFacts
from trainhub.core.states import TrialState
from trainhub.sim.cluster import ClusterSpec
from trainhub.sim.estimates import Key, ServerEstimates, measured_run_s
from trainhub.sim.events import Event, EventKind, EventQueue
from trainhub.sim.idle import IdleWhileFits
from trainhub.sim.ledger import TenantTimeline
from trainhub.sim.metrics import JobRecord, SimResult
from trainhub.sim.network import NetworkModel, ideal_span, span_of
from trainhub.sim.trace import TraceJob


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
            As the server: a job's run time is what the control loop measures over its
            attempts (restarts, lost work and the tick included, ``sim.estimates``), the
            latest ``estimates_window`` finishes count, and they are read every
            ``estimates_refresh_s``, when the facts whose estimate changed are made again.
        estimates_refresh_s: how often the server reads the finished run times (the control
            loop's ``estimates_refresh_s``); 0: a finish counts from the instant it is seen.
        estimate_min_samples: runs a median needs (the loop's ``estimate_min_samples``).
        estimates_window: how many of the latest finishes count (``FINISHED_RUNS_READ``).
        half_life_s: half-life of the decayed tenant usage handed to the policy.
        pass_interval_s: the least time between two scheduling passes, like the tick of a
            control loop: events closer to the last pass than this wait for a pass at the
            next tick. 0 runs a pass after every instant with events.
        tick_s: a control loop's fixed period (issue 27): passes run only at multiples of
            it (``now`` a multiple: at once; else at the next one), at every one while
            anything waits (as the loop decides at each tick), and the end of an attempt
            (a finish, or a preempted attempt's exit) is seen at the first tick at or after
            it, as the server observes exits when it polls: until then the GPUs stay held and
            the job unfinished. Work lost by a preemption counts up to the exit itself. 0:
            every instant is seen when it happens.
        max_passes: stop after this many scheduling passes (a guard against livelock).
        network: the cluster's bandwidth per topology level (sim/network.py): a gang placed
            wider than its ideal span (one node, else one rack, else one block) runs slower
            by its model's slowdown; None: placement never changes a job's run time.
    """

    checkpoint_interval_s: float = 1800.0
    checkpoint_time_s: float = 30.0
    save_on_preempt: bool = False
    restart_overhead_s: float = 60.0
    known_durations: bool = False
    estimated_durations: bool = False
    estimates_refresh_s: float = 60.0
    estimate_min_samples: int = 3
    estimates_window: int = FINISHED_RUNS_READ
    half_life_s: float = 24 * 3600.0
    pass_interval_s: float = 0.0
    tick_s: float = 0.0
    max_passes: int = 50_000_000
    network: NetworkModel | None = None

    def __post_init__(self) -> None:
        for name in (
            "checkpoint_interval_s",
            "checkpoint_time_s",
            "restart_overhead_s",
            "pass_interval_s",
            "tick_s",
            "estimates_refresh_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.half_life_s <= 0:
            raise ValueError("half_life_s must be > 0")
        if self.estimate_min_samples < 1 or self.estimates_window < 1:
            raise ValueError("estimate_min_samples and estimates_window must be >= 1")


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
        cpu = time.process_time()
        with collection_paused():
            return _Run(self).run(wall, cpu)


@dataclass(slots=True)
class _JobState:
    """One admitted job's progress across its attempts (the trace holds only its first ask)."""

    job: TraceJob
    request: ResourceRequest
    record: JobRecord
    # productive time still to do: shrinks only by what a checkpoint saved
    remaining_s: float
    # GPU-time held over all attempts, the attained service a policy such as LAS ranks by
    attained_gpu_s: float = 0.0
    # the current (or last) attempt's number, start and restart overhead; 0 before the first
    attempt: int = 0
    started_at: float = 0.0
    overhead_s: float = 0.0
    # when a preempted attempt exits (its work counts up to there; the tick sees it later)
    exit_at: float = math.inf
    # when the attempt's work ends, if it runs on
    finish_at: float = math.inf
    # how much slower than at its ideal span the attempt runs (sim/network.py)
    slowdown: float = 1.0
    # its attempts' run times as the control loop measures them (the server's estimates)
    measured_s: float = 0.0


class _Run:
    """The books of one simulation and the steps that change them, one method per kind of step.

    Kept apart from ``Simulator`` (what to simulate) so that each step reads on its own: the
    event loop, an arrival, an attempt that ends (finished, or released after a preemption),
    a scheduling pass and the decisions it returns, and the accounting of held GPU-time.
    """

    def __init__(self, sim: Simulator) -> None:
        self.cfg = sim.config
        self.policy = sim.policy
        self.tenants = sim.tenants
        self.total_gpus = sim.cluster.total_gpus
        # the control loop's own snapshot builder: the policy sees the same view of the same facts
        self.builder = SnapshotBuilder.for_policy(sim.policy)
        node_facts = [spec.facts() for spec in sim.cluster.nodes]
        self.builder.set_nodes(node_facts)
        # free capacity per node; IdleWhileFits reads these same dicts, so they change in place
        self.free_g = {n.node_id: n.total_gpus for n in node_facts}
        self.total_g = dict(self.free_g)
        self.free_c = {n.node_id: n.total_cpus for n in node_facts}
        self.free_m = {n.node_id: n.total_memory_gb for n in node_facts}

        self.jobs = sim.jobs
        requests = {j.job_id: j.request() for j in self.jobs}
        self.records = {
            j.job_id: JobRecord(j.job_id, j.tenant, j.num_gpus, j.submit_s, j.duration_s)
            for j in self.jobs
        }
        self.rejected = _never_fitting(
            self.jobs, requests, [spec.node() for spec in sim.cluster.nodes]
        )
        skip = set(self.rejected)
        self.arrivals = [j for j in self.jobs if j.job_id not in skip]
        self.at_arrival = 0  # index of the next arrival
        self.next_arrival_s = self.arrivals[0].submit_s if self.arrivals else math.inf
        self.states = {
            j.job_id: _JobState(j, requests[j.job_id], self.records[j.job_id], j.duration_s)
            for j in self.arrivals
        }
        # what the policy knows of each queued, running or preempting job
        self.facts: dict[int, TrialFacts] = {}
        self.events = EventQueue()

        tenant_names = sorted({j.tenant for j in self.arrivals} | set(self.tenants))
        self.start = self.arrivals[0].submit_s if self.arrivals else 0.0
        self.estimates = ServerEstimates(
            self.cfg.estimate_min_samples,
            self.cfg.estimates_window,
            self.cfg.estimates_refresh_s,
            self.cfg.tick_s,
            origin=self._seen(self.start),
        )
        # fairness is measured against the guarantees the policy can honour (scaled to fit)
        guarantees = scaled_guarantees(
            {t: self.tenants.get(t, TenantShare()).guaranteed_slots for t in tenant_names},
            self.total_gpus,
        )
        self.timeline = TenantTimeline(tenant_names, guarantees, self.start)
        # what the policy reads of each tenant's standing, kept only for a policy that reads it
        half_life = self.policy.standing_half_life_s
        self.standing: EntitlementLedger | None = None
        if half_life is not None:
            self.standing = EntitlementLedger(half_life)
            self.standing.set_guarantees(guarantees, self.start)
        self.usage = DecayedUsage(self.cfg.half_life_s, self.start, tenant_names)
        self.idle = IdleWhileFits(self.free_g, self.free_c, self.free_m, self.start)
        self.last = self.start  # the instant accounted up to
        self.passes = 0
        self.last_pass = -math.inf
        self.held = 0  # GPUs held by running and preempting attempts
        self.busy_gpu_s = 0.0
        self.lost_gpu_s = 0.0
        # GPU-time held while jobs still arrive: utilisation under the offered load
        self.last_arrival = self.arrivals[-1].submit_s if self.arrivals else self.start
        self.arriving_gpu_s = 0.0
        # topology: each node's labels, the largest domain per level, what starts spanned
        self.labels = {n.node_id: dict(n.labels) for n in sim.cluster.nodes}
        self.racks: dict[str, list[str]] = {}
        for node_id, labels in self.labels.items():
            if "rack" in labels:
                self.racks.setdefault(labels["rack"], []).append(node_id)
        self.largest = {s: sim.cluster.domain_gpus(s) for s in ("node", "rack", "block")}
        self.spans: dict[str, int] = {}  # "ideal->spanned": starts of multi-node gangs
        self.fragmentation_sum = 0.0
        self.fragmentation_n = 0

    def run(self, wall: float, cpu: float) -> SimResult:
        """Jump from instant to instant; at each, take in its arrivals and job events, then
        run a scheduling pass if anything waits, as the control loop does after a change.

        ``wall`` and ``cpu`` are the clocks at ``Simulator.run``: the result's timings
        include the set-up.
        """
        events = self.events
        while True:
            now = min(self.next_arrival_s, events.next_at())
            if now == math.inf:
                break  # no arrival and no event left
            self._account_until(now)
            changed: list[TrialFacts] = []
            gone: list[int] = []
            # as a tick: the ends seen first, then the estimates read, then the new trials
            for event in events.pop_due(now):
                self._end_attempt(event, now, changed, gone)
            if self.cfg.estimated_durations and not self.cfg.known_durations:
                changed += self._estimates_read(now)
            if self.next_arrival_s <= now:
                changed += self._admit_arrivals(now)
            if changed or gone:
                self.builder.update(changed, gone)
                self.idle.changed(self.builder.queue)
            if not self.builder.num_queued or not self._pass_due(now):
                continue
            self._run_pass(now)
            if self.cfg.tick_s and self.builder.num_queued:
                # the loop decides again at its next tick while anything waits
                events.wake_at(now + self.cfg.tick_s)
            if not events and self.next_arrival_s == math.inf and self.builder.num_queued:
                break  # nothing will ever change: the rest can never start
        return self._result(wall, cpu)

    def _account_until(self, now: float) -> None:
        """Integrate held and idle GPU-time up to ``now``: the state is constant between
        instants, so each gap is counted once, before the instant's events change it."""
        if now <= self.last:
            return
        self.busy_gpu_s += self.held * (now - self.last)
        if self.last < self.last_arrival:
            self.arriving_gpu_s += self.held * (min(now, self.last_arrival) - self.last)
        self.idle.advance(now)
        self.last = now

    def _admit_arrivals(self, now: float) -> list[TrialFacts]:
        """Queue the jobs submitted by ``now``; their facts, for the snapshot builder."""
        arrivals = self.arrivals
        queued: list[TrialFacts] = []
        while self.next_arrival_s <= now:
            job = arrivals[self.at_arrival]
            self.at_arrival += 1
            self.next_arrival_s = (
                arrivals[self.at_arrival].submit_s if self.at_arrival < len(arrivals) else math.inf
            )
            queued.append(self._queued_facts(job.job_id, now))
            self._account(job.tenant, now, demand=job.num_gpus)
        return queued

    def _account(self, tenant: str, now: float, held: int = 0, demand: int = 0) -> None:
        """``tenant`` holds ``held`` and demands ``demand`` GPUs more from ``now`` on."""
        self.timeline.change(tenant, now, held=held, demand=demand)
        if self.standing is not None:
            self.standing.change(tenant, now, held=held, demand=demand)

    def _end_attempt(
        self, event: Event, now: float, changed: list[TrialFacts], gone: list[int]
    ) -> None:
        """An attempt finishes or, preempted, releases its GPUs: the job leaves the books
        (``gone``) or queues again (``changed``). Events of an attempt that already ended
        (a finish scheduled before the job was preempted) are stale and do nothing."""
        trial = self.facts.get(event.job_id)
        if trial is None or not trial.state.is_active:
            return
        state = self.states[event.job_id]
        if state.attempt != event.attempt:
            return
        if event.kind is EventKind.FINISH and state.exit_at < state.finish_at:
            return  # it exited, preempted, before its work ended (both seen at one tick)
        slots = trial.request.num_slots
        self._hold(state.request, trial.placement, -1)
        self.held -= slots
        self._account(trial.tenant, now, held=-slots)
        self.usage.change(trial.tenant, now, -slots)
        ran = now - state.started_at
        state.attained_gpu_s += slots * ran
        state.measured_s += measured_run_s(state.started_at, now, self.cfg.tick_s)
        if event.kind is EventKind.FINISH:
            self._finish(state, slots, now)
            gone.append(event.job_id)
        else:
            self._lose_unsaved_work(state, state.exit_at - state.started_at, slots)
            changed.append(self._queued_facts(event.job_id, now))

    def _finish(self, state: _JobState, slots: int, now: float) -> None:
        """Record the job's end; its run time now informs the estimates of later jobs."""
        job = state.job
        state.record.finish_s = now
        if self.cfg.estimated_durations and not self.cfg.known_durations:
            key = _key(job)
            self.estimates.forget(job.job_id, key)
            self.estimates.finished(now, job.job_id, key, state.measured_s)
        self._account(job.tenant, now, demand=-slots)
        del self.facts[job.job_id]

    def _lose_unsaved_work(self, state: _JobState, ran: float, slots: int) -> None:
        """A preempted attempt keeps only the progress up to its last checkpoint (all of it
        with ``save_on_preempt``); the rest is lost GPU-time. The restart overhead it paid
        first is never progress."""
        cfg = self.cfg
        # the work done: the time it ran, at the pace its placement allowed
        productive = max(0.0, ran - state.overhead_s) / state.slowdown
        saved = productive
        if not cfg.save_on_preempt and cfg.checkpoint_interval_s > 0:
            saved = math.floor(productive / cfg.checkpoint_interval_s) * cfg.checkpoint_interval_s
        saved = min(saved, state.remaining_s)
        state.remaining_s -= saved
        self.lost_gpu_s += (productive - saved) * slots * state.slowdown

    def _pass_due(self, now: float) -> bool:
        """Whether a scheduling pass runs at ``now``: with ``pass_interval_s``, passes keep
        the control loop's tick, and an instant too close to the last pass waits for the
        next tick (a wake-up) instead."""
        tick = self.cfg.tick_s
        if tick:
            due = self._seen(now)
            if now < due:
                self.events.wake_at(due)
                return False
        interval = self.cfg.pass_interval_s
        if interval and now < self.last_pass + interval:
            self.events.wake_at(self.last_pass + interval)
            return False
        return True

    def _run_pass(self, now: float) -> None:
        """One scheduling pass: the policy decides on a snapshot, the simulator carries out
        its preemptions, then its starts (a start may use what a preemption frees only once
        the victim has released it), then remembers the wake-up it asks for."""
        cfg = self.cfg
        self.last_pass = now
        self.usage.now = now
        standing = self.standing.standing(now) if self.standing is not None else None
        snapshot = self.builder.snapshot(now, self.tenants, self.usage, standing)
        self.passes += 1
        if self.passes > cfg.max_passes:
            raise SimulationError(f"more than {cfg.max_passes} scheduling passes")
        starts, preempts, wake_at = split_decisions(self.policy.decide(snapshot))
        changed: list[TrialFacts] = []
        for preempt in preempts:
            changed.append(self._preempt(preempt.trial_id, now))
        for decision in starts:
            changed.append(self._start(decision, now))
        if changed:
            self.builder.update(changed)
            self.idle.changed(self.builder.queue)
        if self.racks:
            self._sample_fragmentation()
        if wake_at is not None and now < wake_at:
            self.events.wake_at(wake_at)

    def _preempt(self, job_id: int, now: float) -> TrialFacts:
        """Tell a running attempt to stop: it keeps its GPUs for ``checkpoint_time_s`` while
        it saves and exits, then releases them."""
        trial = self.facts.get(job_id)
        if trial is None or trial.state is not TrialState.RUNNING:
            raise SimulationError(f"preempt of trial {job_id}, not running")
        if not trial.preemptible:
            raise SimulationError(f"preempt of trial {job_id}, not preemptible")
        preempting = replace(trial, state=TrialState.PREEMPTING)
        self.facts[job_id] = preempting
        state = self.states[job_id]
        state.record.preemptions += 1
        state.exit_at = now + self.cfg.checkpoint_time_s
        self.events.push(self._seen(state.exit_at), EventKind.RELEASE, job_id, state.attempt)
        return preempting

    def _start(self, decision: Start, now: float) -> TrialFacts:
        """Start a queued job's next attempt where the policy placed it, after checking the
        decision against the policy contract (whole gang, no over-allocation); its finish is
        scheduled at once and goes stale if it is preempted first."""
        cfg = self.cfg
        job_id = decision.trial_id
        queued = self.facts.get(job_id)
        if queued is None or queued.state is not TrialState.QUEUED:
            raise SimulationError(f"start of trial {job_id}, which is not queued")
        state = self.states[job_id]
        request = state.request
        if len(decision.placement) != request.num_workers:
            raise SimulationError(
                f"trial {job_id}: {len(decision.placement)} ranks placed, "
                f"gang has {request.num_workers}"
            )
        number = state.attempt + 1
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
            # the estimate as it is now (a policy that reads none while queued left it stale)
            expected_duration_s=self._expected_duration(
                state.job, self.policy.reads_running_durations
            ),
        )
        self._hold(request, decision.placement, +1)
        for node_id in set(decision.placement):
            if (
                self.free_g[node_id] < 0
                or self.free_c[node_id] < -1e-9
                or self.free_m[node_id] < -1e-9
            ):
                raise SimulationError(f"trial {job_id} over-allocates node {node_id}")
        state.attempt = number
        state.overhead_s = cost
        state.started_at = now
        state.exit_at = math.inf
        state.slowdown = self._slowdown(request, decision.placement)
        state.finish_at = now + cost + state.remaining_s * state.slowdown
        self.facts[job_id] = trial
        self.held += request.num_slots
        self._account(trial.tenant, now, held=request.num_slots)
        self.usage.change(trial.tenant, now, request.num_slots)
        if state.record.first_start_s is None:
            state.record.first_start_s = now
        self.events.push(self._seen(state.finish_at), EventKind.FINISH, job_id, number)
        return trial

    def _slowdown(self, request: ResourceRequest, placement: tuple[str, ...]) -> float:
        """How much slower than at its ideal span a gang placed so runs; the span counted."""
        network = self.cfg.network
        if network is None or (
            len(set(placement)) <= 1 and request.num_slots <= self.largest["node"]
        ):
            return 1.0
        ideal = ideal_span(request.num_slots, self.largest)
        spanned = span_of(placement, self.labels)
        key = f"{ideal}->{spanned}"
        self.spans[key] = self.spans.get(key, 0) + 1
        return network.slowdown(ideal, spanned)

    def _sample_fragmentation(self) -> None:
        """The share of free GPUs in racks that are partly used (neither whole nor full):
        capacity a rack-sized gang cannot use without spanning racks."""
        if not self.racks:
            return
        free_all = partial = 0
        for members in self.racks.values():
            free = sum(self.free_g[n] for n in members)
            total = sum(self.largest_node_of(n) for n in members)
            free_all += free
            if 0 < free < total:
                partial += free
        if free_all:
            self.fragmentation_sum += partial / free_all
            self.fragmentation_n += 1

    def largest_node_of(self, node_id: str) -> int:
        return self.total_g[node_id]

    def _seen(self, at: float) -> float:
        """When the server sees what happens at ``at``: the first tick at or after it."""
        tick = self.cfg.tick_s
        if not tick:
            return at
        # a tolerance for times that are a multiple but not exactly in floating point
        return math.ceil(at / tick - 1e-9) * tick

    def _hold(self, request: ResourceRequest, placement: tuple[str, ...], sign: int) -> None:
        """Take (``sign`` +1) or give back (-1) one worker's share of each placed node."""
        g, c, m = request.gpus_per_worker, request.cpus_per_worker, request.memory_gb_per_worker
        free_g, free_c, free_m = self.free_g, self.free_c, self.free_m
        for node_id in placement:
            free_g[node_id] -= sign * g
            free_c[node_id] -= sign * c
            free_m[node_id] -= sign * m

    def _queued_facts(self, job_id: int, at: float) -> TrialFacts:
        """The job as the policy sees it while it waits (arrived, or back after a preemption)."""
        state = self.states[job_id]
        job = state.job
        made = TrialFacts(
            trial_id=job_id,
            tenant=job.tenant,
            state=TrialState.QUEUED,
            request=state.request,
            priority=job.priority,
            queued_at=at,
            submitted_at=job.submit_s,
            attained_service=state.attained_gpu_s,
            progress_s=job.duration_s - state.remaining_s,
            expected_duration_s=self._expected_duration(job, self.policy.reads_queued_durations),
            num_preemptions=state.record.preemptions,
        )
        self.facts[job_id] = made
        return made

    def _expected_duration(self, job: TraceJob, read: bool) -> float | None:
        """What the policy is told of a job's run time: the truth, the server's estimate, or
        nothing (see ``SimConfig``). ``read``: the policy reads it in the job's new state, so
        a refresh of the estimates that changes it remakes the job's facts."""
        if self.cfg.known_durations:
            return job.duration_s
        if self.cfg.estimated_durations:
            return self.estimates.estimate(job.job_id, _key(job), track=read)
        return None

    def _estimates_read(self, now: float) -> list[TrialFacts]:
        """The server's refresh of its estimates, if one falls by ``now``: the facts of the
        queued and active jobs whose estimate changed, made again."""
        remade = []
        for job_id, estimate in self.estimates.publish(now).items():
            facts = self.facts.get(job_id)
            if facts is not None and facts.expected_duration_s != estimate:
                facts = replace(facts, expected_duration_s=estimate)
                self.facts[job_id] = facts
                remade.append(facts)
        return remade

    def _result(self, wall: float, cpu: float) -> SimResult:
        self.idle.advance(self.last)
        self.timeline.settle(self.last)
        return SimResult(
            policy=self.policy.name,
            records=[self.records[j.job_id] for j in self.jobs],
            rejected=self.rejected,
            total_gpus=self.total_gpus,
            busy_gpu_s=self.busy_gpu_s,
            lost_gpu_s=self.lost_gpu_s,
            passes=self.passes,
            timeline=self.timeline,
            wall_s=time.perf_counter() - wall,
            idle_gpu_s=self.idle.idle_gpu_s,
            arriving_gpu_s=self.arriving_gpu_s,
            arriving_s=self.last_arrival - self.start,
            span_s=self.last - self.start,
            cpu_s=time.process_time() - cpu,
            extra=self._topology_extra(),
        )

    def _topology_extra(self) -> dict[str, object]:
        if not self.racks:
            return {}
        n = self.fragmentation_n
        return {
            "spans": dict(sorted(self.spans.items())),
            "fragmentation": self.fragmentation_sum / n if n else math.nan,
        }


def _key(job: TraceJob) -> Key:
    """The user and project a trace job stands for in duration estimates: traces have no
    users or projects, so the tenant stands for the user and the tenant with the GPU count for
    the project."""
    return job.tenant, f"{job.tenant}:{job.num_gpus}"


def _never_fitting(
    jobs: Sequence[TraceJob], requests: Mapping[int, ResourceRequest], nodes: Sequence[Node]
) -> list[int]:
    """The ids of the jobs no node of the empty cluster could ever hold, in trace order: the
    server refuses them at submit, so they never arrive. Jobs share a few request shapes:
    one fit check per shape, not per job."""
    never: dict[tuple[object, ...], bool] = {}
    rejected = []
    for j in jobs:
        request = requests[j.job_id]
        key = _request_key(request)
        unfittable = never.get(key)
        if unfittable is None:
            unfittable = never[key] = can_ever_fit(request, nodes) is not None
        if unfittable:
            rejected.append(j.job_id)
    return rejected


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
        request.topology,
    )
