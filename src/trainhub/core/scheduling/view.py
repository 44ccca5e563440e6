"""One view for the control loop and the simulator: recorded facts in, a policy ``Snapshot`` out.

The control plane reads its facts from the database (trials, attempts, checkpoints, nodes from
the executor and the monitor); the simulator keeps the same facts about its simulated jobs.
Both hand them to this module, so a policy decides on the same inputs in both places: LAS sees
attained service, SJF and backfill see expected durations, preemption is priced by the work
since the last checkpoint, thermal placement sees GPU temperatures, and free capacity is
counted by the same books (totals minus what active trials hold).

The API, small and stable:

- :class:`TrialFacts`: what is known about one queued or active trial;
- :class:`NodeFacts`: what is known about one node (capacity, health, temperature);
- :func:`build_snapshot`: ``(now, trials, nodes, tenants, tenant_usage) -> Snapshot``, pure;
- :class:`SnapshotBuilder`: the same function with memory between calls: views whose facts
  did not change are reused (the policy's caches stay warm), and a caller that knows what
  changed (the simulator) passes only that;
- :func:`queued_view`, :func:`running_view`: one trial's facts as the policy sees them;
- :func:`estimate_duration`: an expected run time from the durations of finished trials.

Invariants: views depend on facts only (never on ``now``), so equal facts give equal views;
a trial in QUEUED is queued, one in SCHEDULED/RUNNING/PREEMPTING runs where its placement
says; every other state is not in the snapshot.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
import operator
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from trainhub.core.entitlement import Standing
from trainhub.core.resources import Node, ResourceRequest
from trainhub.core.scheduling.base import BasePolicy
from trainhub.core.scheduling.nodetable import HOT_GPU_TEMPERATURE_C, NodeTable
from trainhub.core.scheduling.queue import SUBMISSION_ORDER, QueueOrder, TrialQueue
from trainhub.core.scheduling.runningtable import RunningTable
from trainhub.core.scheduling.snapshot import QueuedTrial, RunningTrial, Snapshot, TenantShare
from trainhub.core.spec import Priority
from trainhub.core.states import TrialState

__all__ = [
    "NodeFacts",
    "SnapshotBuilder",
    "TrialFacts",
    "build_snapshot",
    "estimate_duration",
    "queued_view",
    "running_view",
]


@dataclass(frozen=True, kw_only=True)
class TrialFacts:
    """What is recorded about one trial that waits or holds resources.

    Times are seconds of the caller's clock (the server's wall clock, the simulator's time).

    Attributes:
        trial_id: the trial.
        tenant, user, project: who it belongs to (fair share, per-user estimates).
        state: QUEUED, or SCHEDULED/RUNNING/PREEMPTING while an attempt holds resources.
        request: the gang it needs (workers, GPUs, CPUs and memory per worker, placement).
        priority: its priority.
        submitted_at: first submission; order among equals.
        queued_at: when it (re-)entered the queue.
        attained_service: slot-seconds of its finished attempts (LAS; the running attempt's
            share is added by the policy from ``attempt_started_at``).
        progress_s: run time its latest checkpoint holds: where the next attempt resumes.
        expected_duration_s: expected run time of the whole trial from the beginning, when
            known (the simulator's trace, or :func:`estimate_duration` in the server).
        preemptible: False keeps the policy from ever preempting it.
        num_preemptions: attempts that ended in a preemption (cool-down against ping-pong).
        placement: node id of each rank of the active attempt (empty while queued).
        attempt_started_at: when the active attempt started (active states only).
        last_checkpoint_at: the latest checkpoint of the active attempt, or when its progress
            started counting; None: the attempt's start.
        checkpoint_every_s: the usual time between its checkpoints, when known.
    """

    trial_id: int
    tenant: str
    state: TrialState
    request: ResourceRequest
    user: str = ""
    project: str = ""
    priority: Priority = Priority.NORMAL
    submitted_at: float = 0.0
    queued_at: float = 0.0
    attained_service: float = 0.0
    progress_s: float = 0.0
    expected_duration_s: float | None = None
    preemptible: bool = True
    num_preemptions: int = 0
    placement: tuple[str, ...] = ()
    attempt_started_at: float | None = None
    last_checkpoint_at: float | None = None
    checkpoint_every_s: float | None = None

    @property
    def expected_remaining_s(self) -> float | None:
        """Expected run time left from its latest checkpoint, when a duration is known."""
        if self.expected_duration_s is None:
            return None
        return max(0.0, self.expected_duration_s - self.progress_s)


class NodeOverlay(NamedTuple):
    """A node as its monitor sees it: whether it may take new trials, its hottest GPU's
    temperature, and, when it may not, why in words ("cordoned", "draining", "unhealthy")."""

    schedulable: bool
    temperature_c: float | None = None
    held: str = ""
    # topology and other labels from the node's agent and `trainhub nodes label` (these win
    # over the cluster engine's own); None: none known
    labels: Mapping[str, str] | None = None


@dataclass(frozen=True, kw_only=True)
class NodeFacts:
    """What is known about one node: capacity, health, labels, GPU temperature.

    Free capacity is not a fact here: the snapshot counts it by the books, totals minus what
    the active trials' placements hold (the executor's own free counts lag behind gangs being
    placed, and the scheduler's trials are the only users of training resources).
    """

    node_id: str
    total_gpus: int
    total_cpus: float
    total_memory_gb: float = math.inf
    alive: bool = True
    cordoned: bool = False  # alive, but takes no new trials (cordoned, draining, unhealthy)
    held: str = ""  # which of those, in words (the queue reason names it)
    hostname: str | None = None  # as the cluster engine names the machine
    labels: Mapping[str, str] = field(default_factory=dict)
    gpu_model: str | None = None
    # hottest GPU on the node in degrees Celsius, when a monitor reports it
    gpu_temperature_c: float | None = None

    @classmethod
    def of(cls, node: Node) -> NodeFacts:
        """The facts of a node as an executor lists it (its free counts are ignored)."""
        return cls(
            node_id=node.node_id,
            total_gpus=node.total_gpus,
            total_cpus=node.total_cpus,
            total_memory_gb=node.total_memory_gb,
            alive=node.alive,
            labels=node.labels,
            gpu_model=node.gpu_model,
            gpu_temperature_c=node.gpu_temperature_c,
            hostname=node.hostname,
        )


def queued_view(facts: TrialFacts) -> QueuedTrial:
    """The policy's view of a queued trial."""
    return QueuedTrial(
        trial_id=facts.trial_id,
        tenant=facts.tenant,
        request=facts.request,
        priority=facts.priority,
        queued_at=facts.queued_at,
        submitted_at=facts.submitted_at,
        user=facts.user,
        expected_duration_s=facts.expected_remaining_s,
        attained_service=facts.attained_service,
    )


def running_view(facts: TrialFacts) -> RunningTrial:
    """The policy's view of a trial whose attempt holds resources."""
    started = facts.attempt_started_at if facts.attempt_started_at is not None else 0.0
    return RunningTrial(
        trial_id=facts.trial_id,
        tenant=facts.tenant,
        request=facts.request,
        placement=facts.placement,
        priority=facts.priority,
        started_at=started,
        user=facts.user,
        preemptible=facts.preemptible,
        attained_service=facts.attained_service,
        expected_duration_s=facts.expected_remaining_s,
        submitted_at=facts.submitted_at,
        preempting=facts.state == TrialState.PREEMPTING,
        num_preemptions=facts.num_preemptions,
        last_checkpoint_at=facts.last_checkpoint_at,
        checkpoint_every_s=facts.checkpoint_every_s,
    )


def estimate_duration(
    finished: Sequence[tuple[str, str, float]], user: str, project: str, min_samples: int = 3
) -> float | None:
    """Expected run time of a new trial of ``user`` in ``project``.

    ``finished`` holds ``(user, project, run_time_s)`` of completed trials. The median of the
    same user and project when there are ``min_samples`` of them, else of the same project,
    else of the same user; None when nothing is known (SJF and backfill then treat the trial
    as of unknown length).
    """
    tiers = (
        [d for u, p, d in finished if u == user and p == project],
        [d for _, p, d in finished if p == project],
        [d for u, _, d in finished if u == user],
    )
    for runs in tiers:
        if len(runs) >= min_samples:
            return float(statistics.median(runs))
    return None


# how many finished trials the server reads for its estimates, the latest first
# (``Repository.finished_runs``); the simulator keeps the same window
FINISHED_RUNS_READ = 5000


class DurationEstimates:
    """:func:`estimate_duration` kept up to date one finished trial at a time (the simulator
    adds each job as it completes; the answers equal ``estimate_duration`` over the same
    finished trials). With ``window``, only the latest ``window`` runs added count, as the
    server reads only the latest ``FINISHED_RUNS_READ`` finished trials."""

    def __init__(self, min_samples: int = 3, window: int | None = None) -> None:
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 run or None, got {window}")
        self.min_samples = min_samples
        self.window = window
        self._by_pair: dict[tuple[str, str], list[float]] = {}
        self._by_project: dict[str, list[float]] = {}
        self._by_user: dict[str, list[float]] = {}
        self._order: collections.deque[tuple[str, str, float]] = collections.deque()

    def add(self, user: str, project: str, run_time_s: float) -> None:
        bisect.insort(self._by_pair.setdefault((user, project), []), run_time_s)
        bisect.insort(self._by_project.setdefault(project, []), run_time_s)
        bisect.insort(self._by_user.setdefault(user, []), run_time_s)
        if self.window is None:
            return
        self._order.append((user, project, run_time_s))
        if len(self._order) > self.window:
            old_user, old_project, old_run = self._order.popleft()
            for runs in (
                self._by_pair[(old_user, old_project)],
                self._by_project[old_project],
                self._by_user[old_user],
            ):
                del runs[bisect.bisect_left(runs, old_run)]

    def estimate(self, user: str, project: str) -> float | None:
        for runs in (
            self._by_pair.get((user, project)),
            self._by_project.get(project),
            self._by_user.get(user),
        ):
            if runs is not None and len(runs) >= self.min_samples:
                n = len(runs)
                mid = n // 2
                return runs[mid] if n % 2 else (runs[mid - 1] + runs[mid]) / 2
        return None


_TRIAL_ID = operator.attrgetter("trial_id")
_NODE_ID = operator.attrgetter("node_id")
_IN_SNAPSHOT = frozenset(
    {TrialState.QUEUED, TrialState.SCHEDULED, TrialState.RUNNING, TrialState.PREEMPTING}
)


class SnapshotBuilder:
    """Builds snapshots from facts, reusing the views of facts that did not change.

    Two ways to feed it, which may be mixed:

    - :meth:`build` with every queued/active trial and every node (the control loop reads
      them afresh each tick): a diff against the last call finds what changed;
    - :meth:`update` with only what changed, then :meth:`snapshot` (the simulator, which
      knows its events).
    """

    def __init__(
        self,
        order: QueueOrder = SUBMISSION_ORDER,
        hot_gpu_temperature_c: float | None = HOT_GPU_TEMPERATURE_C,
    ) -> None:
        self._facts: dict[int, TrialFacts] = {}
        self._queued: dict[int, QueuedTrial] = {}
        self._queue = TrialQueue((), order)
        self._running: dict[int, RunningTrial] = {}
        self._running_table = RunningTable()
        self._run_changed: dict[int, RunningTrial] = {}
        self._run_removed: set[int] = set()
        self._hot = hot_gpu_temperature_c
        self._nodes: dict[str, NodeFacts] = {}
        self._node_table = NodeTable((), hot_gpu_temperature_c)
        self._nodes_dirty = False
        # what active trials hold on each node: GPUs, CPUs, memory
        self._held: dict[str, list[float]] = {}
        self._touched: set[str] = set()

    @classmethod
    def for_policy(cls, policy: BasePolicy) -> SnapshotBuilder:
        """A builder indexed the way ``policy`` reads (queue order, hot-GPU threshold)."""
        config = getattr(policy, "config", None)
        hot = getattr(config, "hot_gpu_temperature_c", HOT_GPU_TEMPERATURE_C)
        return cls(policy.queue_order, hot)

    # ------------------------------------------------------------------ feeding
    def build(
        self,
        now: float,
        trials: Iterable[TrialFacts],
        nodes: Iterable[NodeFacts],
        tenants: Mapping[str, TenantShare] | None = None,
        tenant_usage: Mapping[str, float] | None = None,
        tenant_standing: Mapping[str, Standing] | None = None,
    ) -> Snapshot:
        """The snapshot of exactly these trials and nodes at ``now``."""
        # unchanged facts should be the same objects as last time: they are found by an
        # identity check at C speed (a tick reads thousands of trials, and a few change);
        # equal copies cost a field-by-field comparison
        listed = trials if isinstance(trials, list | tuple) else list(trials)
        known = self._facts
        ids = list(map(_TRIAL_ID, listed))
        same = list(map(operator.is_, map(known.get, ids), listed))
        # what the builder holds is always in the snapshot: only the others are checked
        fresh = set(itertools.compress(ids, same))
        changed: list[TrialFacts] = []
        for t in itertools.compress(listed, map(operator.not_, same)):
            if t.state in _IN_SNAPSHOT:
                fresh.add(t.trial_id)
                if known.get(t.trial_id) != t:
                    changed.append(t)
        gone = (
            list(itertools.filterfalse(fresh.__contains__, known))
            if len(known) + len(changed) > len(fresh)
            else []
        )
        self.update(trials=changed, gone=gone)
        self.use_nodes(nodes)
        return self.snapshot(now, tenants, tenant_usage, tenant_standing)

    def use_nodes(self, nodes: Iterable[NodeFacts]) -> None:
        """These nodes from now on; nothing is redone when they are the same objects as the
        last ones (or equal to them)."""
        node_list = nodes if isinstance(nodes, list | tuple) else list(nodes)
        have = self._nodes
        if len(node_list) != len(have) or (
            not all(map(operator.is_, map(have.get, map(_NODE_ID, node_list)), node_list))
            and any((seen := have.get(n.node_id)) is not n and seen != n for n in node_list)
        ):
            self.set_nodes(node_list)

    def set_nodes(self, nodes: Iterable[NodeFacts]) -> None:
        """Replace the node facts (membership, health, temperature or capacity changed)."""
        self._nodes = {n.node_id: n for n in nodes}
        self._nodes_dirty = True

    def update(self, trials: Iterable[TrialFacts] = (), gone: Iterable[int] = ()) -> None:
        """Record new or changed trials and forget ended ones (ids). A trial given twice
        counts as its last facts (the control loop's read and an estimate refresh may both
        remake it in one tick)."""
        added: list[QueuedTrial] = []
        removed: list[QueuedTrial] = []
        for trial_id in gone:
            old = self._facts.pop(trial_id, None)
            if old is not None:
                self._drop(old, removed)
        for facts in {f.trial_id: f for f in trials}.values():
            old = self._facts.get(facts.trial_id)
            if old is not None:
                if old is facts:
                    continue
                self._drop(old, removed)
            if facts.state != TrialState.QUEUED and not facts.state.is_active:
                self._facts.pop(facts.trial_id, None)
                continue
            self._facts[facts.trial_id] = facts
            if facts.state == TrialState.QUEUED:
                view = queued_view(facts)
                self._queued[facts.trial_id] = view
                added.append(view)
            elif facts.state.is_active:
                run = running_view(facts)
                self._running[facts.trial_id] = self._run_changed[facts.trial_id] = run
                self._run_removed.discard(facts.trial_id)
                self._hold(facts, +1)
        if removed:
            self._queue = self._queue.removed(removed)
        if added:
            self._queue = self._queue.added(added)

    def _drop(self, old: TrialFacts, removed: list[QueuedTrial]) -> None:
        if old.state == TrialState.QUEUED:
            removed.append(self._queued.pop(old.trial_id))
        elif old.state.is_active:
            del self._running[old.trial_id]
            self._run_changed.pop(old.trial_id, None)
            if old.trial_id in self._running_table.by_id:
                self._run_removed.add(old.trial_id)
            self._hold(old, -1)

    def _hold(self, facts: TrialFacts, sign: int) -> None:
        request = facts.request
        for node_id in facts.placement:
            held = self._held.setdefault(node_id, [0, 0.0, 0.0])
            held[0] += sign * request.gpus_per_worker
            held[1] += sign * request.cpus_per_worker
            held[2] += sign * request.memory_gb_per_worker
            self._touched.add(node_id)

    # ------------------------------------------------------------------ reading
    @property
    def facts(self) -> Mapping[int, TrialFacts]:
        """The trials it knows, by id."""
        return self._facts

    @property
    def queue(self) -> TrialQueue:
        """The queued trials' views, indexed in the policy's order."""
        return self._queue

    @property
    def num_queued(self) -> int:
        return len(self._queue)

    def snapshot(
        self,
        now: float,
        tenants: Mapping[str, TenantShare] | None = None,
        tenant_usage: Mapping[str, float] | None = None,
        tenant_standing: Mapping[str, Standing] | None = None,
    ) -> Snapshot:
        """The snapshot of what it was told, at ``now``."""
        if self._nodes_dirty:
            self._node_table = NodeTable([self._node(f) for f in self._nodes.values()], self._hot)
            self._nodes_dirty = False
            self._touched.clear()
        elif self._touched:
            changed = {i: self._node(self._nodes[i]) for i in self._touched if i in self._nodes}
            self._touched.clear()
            if changed:
                self._node_table = self._node_table.updated(changed)
        if self._run_changed or self._run_removed:
            self._running_table = self._running_table.updated(
                self._run_changed.values(), self._run_removed
            )
            self._run_changed = {}
            self._run_removed = set()
        return Snapshot(
            now=now,
            nodes=self._node_table,
            queue=self._queue,
            running=self._running_table,
            tenants=tenants if tenants is not None else {},
            tenant_usage=tenant_usage if tenant_usage is not None else {},
            tenant_standing=tenant_standing if tenant_standing is not None else {},
        )

    def _node(self, facts: NodeFacts) -> Node:
        gpus, cpus, memory = self._held.get(facts.node_id, (0, 0.0, 0.0))
        return Node(
            node_id=facts.node_id,
            total_gpus=facts.total_gpus,
            total_cpus=facts.total_cpus,
            free_gpus=facts.total_gpus - int(gpus),
            free_cpus=facts.total_cpus - cpus,
            labels=facts.labels,
            gpu_model=facts.gpu_model,
            gpu_temperature_c=facts.gpu_temperature_c,
            alive=facts.alive,
            cordoned=facts.cordoned,
            held=facts.held,
            hostname=facts.hostname,
            total_memory_gb=facts.total_memory_gb,
            free_memory_gb=facts.total_memory_gb - memory,
        )


def tenant_load(snapshot: Snapshot) -> tuple[dict[str, float], dict[str, float]]:
    """Slots each tenant holds, and demands (held plus queued), in ``snapshot``: read off its
    indexes (per tenant, per queue group), not trial by trial."""
    held: dict[str, float] = dict(RunningTable.coerce(snapshot.running).slots_by_tenant)
    demand = dict(held)
    queue = snapshot.queue
    if not isinstance(queue, TrialQueue):
        queue = TrialQueue(queue, SUBMISSION_ORDER)
    for (tenant, _, _), trials in queue.groups.items():
        if trials:
            demand[tenant] = demand.get(tenant, 0.0) + len(trials) * trials.first.request.num_slots
    return held, demand


def build_snapshot(
    now: float,
    trials: Iterable[TrialFacts],
    nodes: Iterable[NodeFacts],
    tenants: Mapping[str, TenantShare] | None = None,
    tenant_usage: Mapping[str, float] | None = None,
    order: QueueOrder = SUBMISSION_ORDER,
    tenant_standing: Mapping[str, Standing] | None = None,
) -> Snapshot:
    """The policy's snapshot at ``now`` of these trials and nodes (see the module docstring).

    ``order`` is the policy's ``queue_order``; ``tenant_usage`` the decayed usage of
    :class:`trainhub.core.fairshare.DecayedUsage`; ``tenant_standing`` the standings of
    :class:`trainhub.core.entitlement.EntitlementLedger`.
    """
    return SnapshotBuilder(order).build(now, trials, nodes, tenants, tenant_usage, tenant_standing)
