"""The scheduler's facts, read from the server's database: at each tick what changed since
the last one (ADR 0024), all of it at the first tick and every few minutes.

Production keeps what the simulator feeds the policies, and hands it to the same snapshot
builder (:class:`trainhub.core.scheduling.view.SnapshotBuilder`) the simulator calls: each
trial's user and project, its attained service (slot-seconds its ended attempts held), its
progress (run time its latest checkpoint holds), its expected duration (estimated from the
run times of completed trials of the same user and project,
:func:`~trainhub.core.scheduling.view.estimate_duration`), whether it is preemptible (the
spec), how often it was preempted, and for active trials the placement, when the attempt got
its resources, its latest checkpoint and the usual gap between checkpoints (registered by the
runtime). Nodes come from the executor; free capacity is counted by the builder's books.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from trainhub.core.entitlement import EntitlementLedger, Interval
from trainhub.core.fairshare import DecayedUsage, scaled_guarantees
from trainhub.core.resources import Node, ResourceRequest, total_slots
from trainhub.core.scheduling import BasePolicy, Snapshot
from trainhub.core.scheduling.snapshot import TenantShare
from trainhub.core.scheduling.view import (
    NodeFacts,
    NodeOverlay,
    SnapshotBuilder,
    TrialFacts,
    estimate_duration,
    tenant_load,
)
from trainhub.core.spec import ExperimentSpec, Priority
from trainhub.core.states import AttemptOutcome, TrialState
from trainhub.service.records import (
    ActiveRecord,
    Attempt,
    CheckpointTimes,
    SchedulingRecord,
    Trial,
    TrialOwner,
)
from trainhub.service.repository import Repository

_ID = operator.itemgetter(0)  # SchedulingRecord.id
_TRIAL_ID = operator.attrgetter("trial_id")
# what a trial's facts are made of that can change while it waits or runs
# (its id, experiment, tenant and submission never change; its pending note is no fact)
_TRIAL_KEY = operator.itemgetter(
    *map(
        SchedulingRecord._fields.index,
        ("state", "priority", "queued_at", "attained_service", "progress_s"),
    )
)
_ATTEMPT_KEY = operator.attrgetter("id", "created_at", "placement")
_TIMES_KEY = operator.attrgetter("attempt", "last_at", "interval_s")
# what a node's facts are made of (its free counts are not: the builder counts them)
_NODE_KEY = operator.attrgetter(
    "total_gpus",
    "total_cpus",
    "total_memory_gb",
    "alive",
    "labels",
    "gpu_model",
    "gpu_temperature_c",
    "hostname",
)
_NODE_ID = operator.attrgetter("node_id")
_NO_TIMES = CheckpointTimes(trial_id=0, attempt=0, last_at=0.0, interval_s=None)


def trial_facts(
    trial: SchedulingRecord,
    spec: ExperimentSpec,
    owner: TrialOwner | None,
    *,
    attempt: Attempt | None = None,
    num_preemptions: int = 0,
    checkpoints: CheckpointTimes | None = None,
    expected_duration_s: float | None = None,
    request: ResourceRequest | None = None,
) -> TrialFacts:
    """What the database knows of one queued or active trial, as the snapshot builder reads it."""
    placement: tuple[str, ...] = ()
    attempt_started_at = last_checkpoint = interval = None
    if attempt is not None:
        placement = attempt.placement
        # the attempt holds its slots from placement on: service and risk count from there
        attempt_started_at = attempt.created_at
        if checkpoints is not None:
            interval = checkpoints.interval_s
            if checkpoints.attempt == attempt.number:
                last_checkpoint = checkpoints.last_at  # only this attempt's bound the risk
    return TrialFacts(
        trial_id=trial.id,
        tenant=trial.tenant,
        state=trial.state,
        request=request or ResourceRequest.from_spec(spec.resources, spec.distributed.tensor),
        user=owner.user if owner else "",
        project=owner.project if owner else spec.project,
        priority=Priority(trial.priority),
        submitted_at=trial.submitted_at,
        queued_at=trial.queued_at,
        attained_service=trial.attained_service,
        progress_s=trial.progress_s,
        expected_duration_s=expected_duration_s,
        preemptible=spec.preemption.preemptible,
        num_preemptions=num_preemptions,
        placement=placement,
        attempt_started_at=attempt_started_at,
        last_checkpoint_at=last_checkpoint,
        checkpoint_every_s=interval,
    )


def with_overlay(facts: NodeFacts, overlay: Mapping[str, NodeOverlay] | None) -> NodeFacts:
    """A node as the monitor sees it: one that may not take new trials counts as not alive
    to the policy (trials running there keep running), and its GPU temperature is measured."""
    seen = overlay.get(facts.node_id) if overlay else None
    if seen is None:
        return facts
    schedulable, temperature_c, held, labels = NodeOverlay(*seen)
    if labels:
        facts = replace(facts, labels={**facts.labels, **labels})
    return replace(
        facts,
        alive=facts.alive and schedulable,
        cordoned=facts.alive and not schedulable,
        held="" if schedulable else held,
        gpu_temperature_c=temperature_c if temperature_c is not None else facts.gpu_temperature_c,
    )


@dataclass(frozen=True)
class TrialReads:
    """What one tick read of the trials the scheduler sees (:meth:`SchedulingView.read`).

    ``records``: the trials changed since the last read (one record each), in whatever state
    they are now; with ``whole``, every queued and active trial instead (the first read, and a
    resync now and then). ``attempts``, ``preemptions`` and ``checkpoints``: the open
    attempts, preemption counts and checkpoint times of the queued and active ones among them.
    ``mark``: the change number to read from next time.
    """

    records: Sequence[SchedulingRecord]
    whole: bool
    mark: int
    attempts: Mapping[int, Attempt] = field(default_factory=dict)
    preemptions: Mapping[int, int] = field(default_factory=dict)
    checkpoints: Mapping[int, CheckpointTimes] = field(default_factory=dict)


def _scheduled(record: SchedulingRecord) -> bool:
    return record.state is TrialState.QUEUED or record.state.is_active


class SchedulingView:
    """Reads the facts of queued and active trials and builds the policy's snapshot.

    A tick reads only the trials changed since the last one (numbered changes, ADR 0024):
    their scheduling columns, and for those the open attempts, preemptions and checkpoints; it
    remakes their facts and hands the builder those alone. Everything the scheduler reads of a
    trial is numbered when it changes, so the others are as they were. Every ``resync_s`` it
    reads them all again (a change written around the repository would be found there).
    """

    def __init__(
        self,
        policy: BasePolicy,
        half_life_s: float,
        estimates_refresh_s: float = 60.0,
        estimate_min_samples: int = 3,
        resync_s: float = 300.0,
    ) -> None:
        self.builder = SnapshotBuilder.for_policy(policy)
        # whose estimates the policy reads: only those facts are remade when they change
        self._reads_queued = policy.reads_queued_durations
        self._reads_running = policy.reads_running_durations
        self.usage = DecayedUsage(half_life_s)
        # received and entitled slot-seconds per tenant, for a policy that reads them; rebuilt
        # from the database's history at the first tick (a restart forgets nothing)
        half_life = policy.standing_half_life_s
        self.standing = EntitlementLedger(half_life) if half_life is not None else None
        self._standing_rebuilt = False
        self.half_life_s = half_life_s
        self.estimates_refresh_s = estimates_refresh_s
        self.estimate_min_samples = estimate_min_samples
        self.resync_s = resync_s
        # the queued and active trials as last read (their pending notes as last written)
        self.records: dict[int, SchedulingRecord] = {}
        self._mark: int | None = None
        self._synced_at = float("-inf")
        self._owners: dict[int, TrialOwner] = {}
        self._finished: list[tuple[str, str, float]] = []
        self._estimates: dict[tuple[str, str], float | None] = {}
        self._estimates_at = float("-inf")
        # one request object per experiment: equal facts then compare by identity (fast)
        self._requests: dict[int, ResourceRequest] = {}
        # per trial: what its facts were made of when last made, and the facts (made with
        # the estimates of ``_made_estimates_at``)
        self._keys: dict[int, tuple[object, ...]] = {}
        self._made: dict[int, TrialFacts] = {}
        self._made_estimates_at = float("-inf")
        # per node: its listing and overlay at the last tick, and its facts
        self._node_keys: dict[str, tuple[tuple[object, ...], NodeFacts]] = {}

    def _request(self, experiment_id: int, spec: ExperimentSpec) -> ResourceRequest:
        request = self._requests.get(experiment_id)
        if request is None:
            request = self._requests[experiment_id] = ResourceRequest.from_spec(
                spec.resources, spec.distributed.tensor
            )
        return request

    def _expected(self, owner: TrialOwner | None) -> float | None:
        if owner is None:
            return None
        key = (owner.user, owner.project)
        if key not in self._estimates:
            self._estimates[key] = estimate_duration(
                self._finished, owner.user, owner.project, self.estimate_min_samples
            )
        return self._estimates[key]

    def advance_usage(
        self,
        repo: Repository,
        active: Sequence[ActiveRecord],
        attempts: Mapping[int, Attempt],
        now: float,
    ) -> None:
        """Account the slots held since the last tick: what the open attempts hold now, at the
        start of a tick, before any of them is ended or started (exact between ticks)."""
        if not self.usage.initialized:
            horizon = now - 10 * self.half_life_s
            self.usage.rebuild(repo.attempt_usage(horizon), now)
        held: dict[str, float] = {}
        for trial in active:
            attempt = attempts.get(trial.id)
            if attempt is not None:
                held[trial.tenant] = held.get(trial.tenant, 0.0) + attempt.num_slots
        self.usage.advance(held, now)

    # ------------------------------------------------------------------ reading
    def read(self, repo: Repository, now: float) -> TrialReads:
        """Read what changed since the last applied read (everything at the first tick and
        every ``resync_s``), with the open attempts, preemptions and checkpoints of those
        trials; learn the owners of new trials, and every ``estimates_refresh_s`` the run
        times of finished trials (for the duration estimates)."""
        resync = self._mark is None or now - self._synced_at >= self.resync_s
        changes = repo.scheduling_changes(None if resync else self._mark)
        live = [r for r in changes.records if _scheduled(r)]
        ids = [r.id for r in live]
        active_ids = [r.id for r in live if r.state is not TrialState.QUEUED]
        missing = [i for i in ids if i not in self._owners]
        if missing:
            self._owners.update(repo.trial_owners(missing))
        if now - self._estimates_at >= self.estimates_refresh_s:
            self._finished = [(r.user, r.project, r.run_time_s) for r in repo.finished_runs()]
            self._estimates_at = now
        return TrialReads(
            changes.records,
            changes.whole,
            changes.mark,
            attempts=repo.open_attempts(active_ids) if active_ids else {},
            preemptions=(repo.count_outcomes(ids, AttemptOutcome.PREEMPTED.value) if ids else {}),
            checkpoints=repo.checkpoint_times(active_ids) if active_ids else {},
        )

    def apply(self, reads: TrialReads, specs: Mapping[int, ExperimentSpec], now: float) -> None:
        """Bring the records and the builder up to ``reads``: the facts of the trials read are
        made again (the same object where nothing they are made of changed), trials that left
        the queue or ended leave the builder, and so does an active trial without an open
        attempt (its end is recorded at the next observation)."""
        live = [r for r in reads.records if _scheduled(r)]
        if reads.whole:
            seen = set(map(_ID, live))
            gone = [i for i in self.records if i not in seen]
            self._synced_at = now
        else:
            gone = [r.id for r in reads.records if not _scheduled(r)]
        records = self.records
        for trial_id in gone:
            if records.pop(trial_id, None) is not None:
                self._owners.pop(trial_id, None)
        records.update(zip(map(_ID, live), live, strict=True))
        made, left_out = self._facts(
            live, specs, reads.attempts, reads.preemptions, reads.checkpoints
        )
        for trial_id in (*gone, *left_out):
            self._keys.pop(trial_id, None)
            self._made.pop(trial_id, None)
        # after the read's facts: a refresh of the estimates remakes those it changed too
        remade = self._estimates_refreshed()
        if len(self._requests) > 4 * len(specs):
            self._requests = {i: r for i, r in self._requests.items() if i in specs}
        self.builder.update(trials=[*made, *remade], gone=[*gone, *left_out])
        self._mark = reads.mark

    def noted(self, notes: Iterable[tuple[int, str | None, int | None]]) -> None:
        """The pending notes (trial, reason, queue position) the control loop wrote."""
        records = self.records
        for trial_id, reason, position in notes:
            record = records.get(trial_id)
            if record is not None:
                records[trial_id] = record._replace(pending_reason=reason, queue_position=position)

    def _estimates_refreshed(self) -> list[TrialFacts]:
        """After a refresh of the finished runs: the facts whose expected duration changed,
        made again (the others are kept), of the trials whose estimates the policy reads
        (``BasePolicy.reads_queued_durations``, ``reads_running_durations``); the others keep
        theirs until their facts are made again for another reason (a start, a requeue), when
        the estimate is read afresh. A queue of thousands of one user's trials under a policy
        that reads none is then not remade every minute."""
        if self._made_estimates_at == self._estimates_at:
            return []
        self._made_estimates_at = self._estimates_at
        before, self._estimates = self._estimates, {}
        changed = {
            key
            for key, estimate in before.items()
            if estimate_duration(self._finished, *key, self.estimate_min_samples) != estimate
        }
        if not changed:
            return []
        remade = []
        reads = {TrialState.QUEUED: self._reads_queued}
        for trial_id, facts in self._made.items():
            if not reads.get(facts.state, self._reads_running):
                continue
            owner = self._owners.get(trial_id)
            if owner is not None and (owner.user, owner.project) in changed:
                remade.append(replace(facts, expected_duration_s=self._expected(owner)))
        self._made.update(zip(map(_TRIAL_ID, remade), remade, strict=True))
        return remade

    def _facts(
        self,
        records: Sequence[SchedulingRecord],
        specs: Mapping[int, ExperimentSpec],
        attempts: Mapping[int, Attempt],
        preemptions: Mapping[int, int],
        checkpoints: Mapping[int, CheckpointTimes],
    ) -> tuple[list[TrialFacts], list[int]]:
        """The facts of these queued and active trials (owners known, see :meth:`read`), and
        the ids of the active ones left out for want of an open attempt.

        A trial whose records say the same as when its facts were last made gets the same
        :class:`TrialFacts` object as then. The records are new objects every read, and the
        snapshot builder finds unchanged trials by identity at C speed; equal copies would
        cost it a field-by-field comparison each, and making them a dataclass each (56 ms a
        tick with 8,112 trials read whole, ADR 0023). The key compared holds what the facts
        are made of that can change: the record's state, priority, queue time, attained
        service and progress, its preemptions, its open attempt and latest checkpoint; the rest
        is fixed per trial (owner) or per experiment (spec, request). Keys are made and
        compared a column at a time (``map`` over the records), not trial by trial.
        """
        queued = [r for r in records if r.state is TrialState.QUEUED]
        active = [r for r in records if r.state is not TrialState.QUEUED]
        active_ids = list(map(_ID, active))
        open_attempts = list(map(attempts.get, active_ids))
        left_out: list[int] = []
        if not all(map(operator.is_not, open_attempts, itertools.repeat(None))):
            # (identity: "None in" would call each attempt's __eq__)
            left_out = [i for i, a in zip(active_ids, open_attempts, strict=True) if a is None]
            active = [t for t, a in zip(active, open_attempts, strict=True) if a is not None]
            active_ids = list(map(_ID, active))
            open_attempts = [a for a in open_attempts if a is not None]
        trials = [*queued, *active]
        ids = [*map(_ID, queued), *active_ids]
        # a queued trial has no attempt and no checkpoint of it
        keys = list(
            zip(
                map(_TRIAL_KEY, trials),
                map(preemptions.get, ids, itertools.repeat(0)),
                itertools.chain(
                    itertools.repeat(None, len(queued)), map(_ATTEMPT_KEY, open_attempts)
                ),
                itertools.chain(
                    itertools.repeat(None, len(queued)),
                    map(_TIMES_KEY, map(checkpoints.get, active_ids, itertools.repeat(_NO_TIMES))),
                ),
                strict=True,
            )
        )
        known_keys, known_facts = self._keys, self._made
        made: list[TrialFacts | None] = list(map(known_facts.get, ids))
        same = map(operator.eq, keys, map(known_keys.get, ids))
        for at in itertools.compress(range(len(ids)), map(operator.not_, same)):
            trial = trials[at]
            spec = specs[trial.experiment_id]
            owner = self._owners.get(trial.id)
            attempt = open_attempts[at - len(queued)] if at >= len(queued) else None
            made[at] = known_facts[trial.id] = trial_facts(
                trial,
                spec,
                owner,
                attempt=attempt,
                num_preemptions=preemptions.get(trial.id, 0),
                checkpoints=checkpoints.get(trial.id) if attempt is not None else None,
                expected_duration_s=self._expected(owner),
                request=self._request(trial.experiment_id, spec),
            )
            known_keys[trial.id] = keys[at]
        return cast("list[TrialFacts]", made), left_out  # every entry is made or known by now

    # ------------------------------------------------------------------ the snapshot
    def snapshot(
        self,
        repo: Repository,
        specs: Mapping[int, ExperimentSpec],
        cluster_nodes: Callable[[], list[Node]],
        now: float,
        node_overlay: Mapping[str, NodeOverlay] | None = None,
    ) -> Snapshot | None:
        """The policy's snapshot of what was applied, now; None when nothing waits.

        ``node_overlay`` (from the monitoring service): per node, whether it may take new
        trials (healthy, not cordoned) and its hottest GPU's temperature.
        """
        tenant_usage = dict(self.usage) if self.usage.initialized else {}
        if self.builder.num_queued == 0:
            # nothing waits: every tenant demands what it holds (the guarantees, which need the
            # tenants and the cluster's nodes, are read again at the next tick with a queue)
            if self.standing is not None:
                if not self._standing_rebuilt:
                    self._ledger(repo, self._tenants(repo), cluster_nodes(), now)
                held: dict[str, float] = {}
                for trial in self.records.values():
                    if trial.state is not TrialState.QUEUED:
                        request = self._request(trial.experiment_id, specs[trial.experiment_id])
                        held[trial.tenant] = held.get(trial.tenant, 0.0) + request.num_slots
                self.standing.observe(held, held, now)
            return None
        tenants = self._tenants(repo)
        node_list = cluster_nodes()
        ledger = self._ledger(repo, tenants, node_list, now)
        return self.compose(now, node_list, node_overlay, tenants, tenant_usage, ledger)

    def compose(
        self,
        now: float,
        nodes: Sequence[Node],
        node_overlay: Mapping[str, NodeOverlay] | None,
        tenants: Mapping[str, TenantShare],
        tenant_usage: Mapping[str, float],
        ledger: EntitlementLedger | None,
    ) -> Snapshot:
        """The builder's snapshot with these nodes, shares and usage, and the standings off
        its own indexes when the policy reads them (no database read)."""
        self.builder.use_nodes(self.node_facts(nodes, node_overlay))
        snapshot = self.builder.snapshot(now, tenants, tenant_usage)
        if ledger is None:
            return snapshot
        # what each tenant holds and demands from now on, off the snapshot's own indexes
        held_now, demand_now = tenant_load(snapshot)
        ledger.observe(held_now, demand_now, now)
        return replace(snapshot, tenant_standing=ledger.standing(now))

    def node_facts(
        self,
        nodes: Sequence[Node],
        overlay: Mapping[str, NodeOverlay] | None = None,
    ) -> list[NodeFacts]:
        """The facts of the executor's nodes as the monitor sees them (:func:`with_overlay`);
        a node whose listing and overlay say the same as at the last tick keeps its
        :class:`NodeFacts` object, for the builder's identity check (as :meth:`facts`)."""
        seen = overlay or {}
        keys = list(zip(map(_NODE_KEY, nodes), map(seen.get, map(_NODE_ID, nodes)), strict=True))
        known = self._node_keys
        out: list[NodeFacts] = []
        for node, key in zip(nodes, keys, strict=True):
            kept = known.get(node.node_id)
            if kept is not None and kept[0] == key:
                out.append(kept[1])
            else:
                out.append(with_overlay(NodeFacts.of(node), overlay))
        self._node_keys = {n.node_id: (k, f) for n, k, f in zip(nodes, keys, out, strict=True)}
        return out

    @staticmethod
    def _tenants(repo: Repository) -> dict[str, TenantShare]:
        return {
            t.name: TenantShare(t.guaranteed_slots, t.limit_slots, t.weight)
            for t in repo.list_tenants()
        }

    def started(
        self,
        trials: Sequence[Trial | SchedulingRecord],
        specs: Mapping[int, ExperimentSpec],
        now: float,
    ) -> None:
        """These trials hold their slots from ``now`` (the decision's starts), as the
        simulator counts them; the next tick's observation confirms what really runs."""
        if self.standing is None:
            return
        for trial in trials:
            slots = self._request(trial.experiment_id, specs[trial.experiment_id]).num_slots
            self.standing.change(trial.tenant, now, held=slots)

    @staticmethod
    def _rebuild_standing(
        repo: Repository, ledger: EntitlementLedger, guarantees: Mapping[str, int], now: float
    ) -> None:
        """The standings of the last ten half-lives of history: attempts held their slots,
        trials demanded theirs from submission to their end (against today's guarantees;
        time paused counts as demand, an approximation that only errs towards reclaiming)."""
        since = now - 10 * ledger.half_life_s
        held = [Interval(a.tenant, a.num_slots, a.start, a.end) for a in repo.attempt_usage(since)]
        demanded = repo.trial_demand(since)
        ledger.rebuild(held, demanded, guarantees, now)

    def _ledger(
        self,
        repo: Repository,
        tenants: Mapping[str, TenantShare],
        nodes: Sequence[Node],
        now: float,
    ) -> EntitlementLedger | None:
        """The standings ledger with today's guarantees (scaled as the policy scales them),
        rebuilt from the database's history on first use; None for a policy that reads none."""
        ledger = self.standing
        if ledger is None:
            return None
        guarantees = {t: s.guaranteed_slots for t, s in tenants.items()}
        # scaled to the slots the policy scales them to
        scaled = scaled_guarantees(guarantees, total_slots(nodes))
        if not self._standing_rebuilt:
            self._rebuild_standing(repo, ledger, scaled, now)
            self._standing_rebuilt = True
        ledger.set_guarantees(scaled, now)
        return ledger
