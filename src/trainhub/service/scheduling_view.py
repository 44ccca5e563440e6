"""The scheduler's view of the server's database: the facts a policy needs, read each tick.

Production keeps what the simulator feeds the policies: each trial's user and attained
service (slot-seconds its ended attempts ran), its expected duration (mean run time of the
completed trials of the same user and project, less what it already ran), whether it is
preemptible (the spec), and, for running trials, the time of their latest checkpoint and the
usual gap between checkpoints (registered by the runtime).

The views are kept between ticks: a trial's view is the same object while nothing it shows
changed, so the policy's indexes (queue order, node and running tables) re-index only changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from trainhub.core.resources import Node, ResourceRequest
from trainhub.core.scheduling import BasePolicy, QueuedTrial, QueueIndex, RunningTrial, Snapshot
from trainhub.core.scheduling.nodetable import NodeTable
from trainhub.core.scheduling.runningtable import RunningTable
from trainhub.core.scheduling.snapshot import TenantShare
from trainhub.core.spec import ExperimentSpec, Priority
from trainhub.core.states import AttemptOutcome, TrialState
from trainhub.service.records import Attempt, CheckpointTimes, Trial, TrialOwner
from trainhub.service.repository import Repository
from trainhub.service.usage import DecayedUsage


def remaining_estimate(mean_run_time_s: float | None, ran_s: float) -> float | None:
    """Expected remaining run time: the mean run time of similar trials, less what ran.

    A trial that already ran longer than the mean is expected to need a tenth of the mean
    more (never zero: it has not finished).
    """
    if mean_run_time_s is None:
        return None
    return max(mean_run_time_s - ran_s, 0.1 * mean_run_time_s)


class SchedulingView:
    """Builds the policy's :class:`Snapshot` from the repository, keeping its indexes warm."""

    def __init__(self, policy: BasePolicy, half_life_s: float, estimates_refresh_s: float) -> None:
        self.policy = policy
        self.half_life_s = half_life_s
        self.estimates_refresh_s = estimates_refresh_s
        self.usage = DecayedUsage(half_life_s)
        self._queue_index = QueueIndex(policy.queue_order)
        self._queued: dict[int, QueuedTrial] = {}
        self._running: dict[int, tuple[tuple[object, ...], RunningTrial]] = {}
        self._running_table = RunningTable()
        self._node_table = NodeTable(())
        self._owners: dict[int, TrialOwner] = {}
        self._estimates: dict[tuple[str, str], float] = {}
        self._estimates_at = float("-inf")

    # ---------------------------------------------------------------- facts
    def _refresh_facts(self, repo: Repository, trials: Sequence[Trial], now: float) -> None:
        missing = [t.id for t in trials if t.id not in self._owners]
        if missing:
            self._owners.update(repo.trial_owners(missing))
        if now - self._estimates_at >= self.estimates_refresh_s:
            self._estimates = {(r.user, r.project): r.mean_run_time_s for r in repo.run_times()}
            self._estimates_at = now

    def _user(self, trial_id: int) -> str:
        owner = self._owners.get(trial_id)
        return owner.user if owner else ""

    def _expected(self, trial: Trial) -> float | None:
        owner = self._owners.get(trial.id)
        if owner is None:
            return None
        return remaining_estimate(
            self._estimates.get((owner.user, owner.project)), trial.run_time_s
        )

    # ---------------------------------------------------------------- views
    def queued_trial(self, trial: Trial, spec: ExperimentSpec) -> QueuedTrial:
        """The policy's view of a queued trial; the same object while its row is unchanged."""
        expected = self._expected(trial)
        known = self._queued.get(trial.id)
        if (
            known is not None
            and known.priority == trial.priority
            and known.queued_at == trial.queued_at
            and known.tenant == trial.tenant
            and known.attained_service == trial.attained_service
            and known.expected_duration_s == expected
        ):
            return known
        made = QueuedTrial(
            trial_id=trial.id,
            tenant=trial.tenant,
            request=ResourceRequest.from_spec(spec.resources),
            priority=Priority(trial.priority),
            queued_at=trial.queued_at,
            submitted_at=trial.submitted_at,
            user=self._user(trial.id),
            expected_duration_s=expected,
            attained_service=trial.attained_service,
        )
        self._queued[trial.id] = made
        return made

    def running_trial(
        self,
        trial: Trial,
        attempt: Attempt,
        spec: ExperimentSpec,
        preemptions: int,
        checkpoints: CheckpointTimes | None,
    ) -> RunningTrial:
        """The policy's view of an active trial; the same object while nothing it shows changed."""
        preempting = trial.state == TrialState.PREEMPTING
        started_at = attempt.started_at or attempt.created_at
        # only this attempt's checkpoints bound the work a preemption loses now
        last_checkpoint = (
            checkpoints.last_at
            if checkpoints is not None and checkpoints.attempt == attempt.number
            else None
        )
        interval = checkpoints.interval_s if checkpoints is not None else None
        expected = self._expected(trial)
        fingerprint = (
            attempt.id,
            started_at,
            preempting,
            preemptions,
            trial.priority,
            last_checkpoint,
            interval,
            expected,
            spec.preemption.preemptible,
        )
        known = self._running.get(trial.id)
        if known is not None and known[0] == fingerprint:
            return known[1]
        made = RunningTrial(
            trial_id=trial.id,
            tenant=trial.tenant,
            request=ResourceRequest.from_spec(spec.resources),
            placement=attempt.placement,
            priority=Priority(trial.priority),
            started_at=started_at,
            user=self._user(trial.id),
            preemptible=spec.preemption.preemptible,
            attained_service=trial.attained_service,
            expected_duration_s=expected,
            submitted_at=trial.submitted_at,
            preempting=preempting,
            num_preemptions=preemptions,
            last_checkpoint_at=last_checkpoint,
            checkpoint_every_s=interval,
        )
        self._running[trial.id] = (fingerprint, made)
        return made

    # ---------------------------------------------------------------- the snapshot
    def snapshot(
        self,
        repo: Repository,
        queued: Sequence[Trial],
        active: Sequence[Trial],
        specs: Mapping[int, ExperimentSpec],
        cluster_nodes: Callable[[], list[Node]],
        now: float,
    ) -> Snapshot | None:
        """The policy's snapshot now; None when nothing waits (usage still advances)."""
        if not self.usage.initialized:
            horizon = now - 10 * self.half_life_s
            self.usage.rebuild(repo.attempt_usage(horizon), now)
        self._refresh_facts(repo, [*queued, *active], now)
        ids = [t.id for t in active]
        attempts = repo.open_attempts(ids)
        preemptions = repo.count_outcomes(ids, AttemptOutcome.PREEMPTED.value)
        checkpoints = repo.checkpoint_times(ids) if queued else {}
        running: list[RunningTrial] = []
        held: dict[str, float] = {}
        for trial in active:
            attempt = attempts.get(trial.id)
            if attempt is None:
                continue
            view = self.running_trial(
                trial,
                attempt,
                specs[trial.experiment_id],
                preemptions.get(trial.id, 0),
                checkpoints.get(trial.id),
            )
            held[trial.tenant] = held.get(trial.tenant, 0.0) + view.request.num_slots
            running.append(view)
        self._running = {r.trial_id: (self._running[r.trial_id][0], r) for r in running}
        tenant_usage = self.usage.advance(held, now)
        waiting = [self.queued_trial(t, specs[t.experiment_id]) for t in queued]
        self._queued = {q.trial_id: q for q in waiting}
        if not waiting:
            return None
        queue = self._queue_index.sync(waiting)
        tenants = {
            t.name: TenantShare(t.guaranteed_slots, t.limit_slots, t.weight)
            for t in repo.list_tenants()
        }
        nodes = free_capacity(cluster_nodes(), running)
        self._node_table = self._node_table.synced(nodes)
        self._running_table = self._running_table.synced(running)
        return Snapshot(
            now=now,
            nodes=self._node_table,
            queue=queue,
            running=self._running_table,
            tenants=tenants,
            tenant_usage=tenant_usage,
        )


def free_capacity(nodes: list[Node], running: Sequence[RunningTrial]) -> tuple[Node, ...]:
    """Free capacity by our own books: totals minus what active trials hold.

    Ray's own free counts lag behind placement groups still being created, and trials of this
    control plane are the only users of the cluster's training resources.
    """
    gpus: dict[str, int] = {}
    cpus: dict[str, float] = {}
    for trial in running:
        request = trial.request
        for node_id in trial.placement:
            gpus[node_id] = gpus.get(node_id, 0) + request.gpus_per_worker
            cpus[node_id] = cpus.get(node_id, 0.0) + request.cpus_per_worker
    return tuple(
        replace(
            n,
            free_gpus=n.total_gpus - gpus.get(n.node_id, 0),
            free_cpus=n.total_cpus - cpus.get(n.node_id, 0.0),
        )
        for n in nodes
    )
