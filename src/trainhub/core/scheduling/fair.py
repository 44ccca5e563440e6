"""Fair share between tenants: guarantees, weighted sharing of idle capacity, backfill.

One pass walks the queue tenant by tenant, always serving next the tenant with the best key:

1. trials of tenants below their guarantee (see :func:`entitled`) come before trials that
   borrow idle capacity; among them, tenants *owed* their guarantee come before *patient*
   ones, which received well over ``patience_share`` of their entitlement recently
   (``Snapshot.tenant_standing``) and wait for free capacity instead of preempting;
2. then the tenant with the lowest fair-share score: its decayed usage (half-life
   ``half_life_s``) as slots held on average, plus the slots it holds now, divided by its weight;
3. inside a tenant: the highest priority after aging (one level per ``aging_interval_s``
   waited), then the lowest attained-service band, then the earliest submitted.

A tenant at its limit waits ("tenant quota of 8 GPUs in use"). The first trial that does not fit
is the head: it gets a reservation, and trials behind it start only where they cannot delay it
(backfill, see ``reservation``). A trial that does not fit may preempt (see ``preemption``):
inside its tenant's guarantee it reclaims capacity other tenants borrow; in any case it may
displace a running trial of its own tenant with a lower priority or a higher service band. The
victims checkpoint and go back to the queue; the trial starts on a pass after they left. A
patient tenant does not reclaim (ADR 0022).

Trials of one tenant, priority and request shape compete for the same capacity, so when one of
them is blocked the rest of its group waits for the same reason without being looked at: a
pass costs the trials it starts plus the number of groups, not the length of the queue.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from trainhub.core.fairshare import guarantee_note, mean_life_s, scaled_guarantees
from trainhub.core.resources import ResourceRequest
from trainhub.core.scheduling.base import BasePolicy
from trainhub.core.scheduling.decisions import DecisionList, Pending, Preempt, Reason, Start
from trainhub.core.scheduling.fair_config import FairShareConfig
from trainhub.core.scheduling.nodepool import NodePool
from trainhub.core.scheduling.preemption import Preemptor
from trainhub.core.scheduling.queue import OrderKey, QueueOrder, Run, Shape, TrialQueue
from trainhub.core.scheduling.reasons import ReasonBook, behind_reason, limit_reason
from trainhub.core.scheduling.reservation import Reservation, reserve
from trainhub.core.scheduling.runningtable import RunningTable
from trainhub.core.scheduling.snapshot import QueuedTrial, Snapshot, TenantShare
from trainhub.core.scheduling.victims import ClaimMemo, PreemptionRules, VictimFacts


class HeadKey(NamedTuple):
    """The order of one tenant's groups: their head trials' aged priorities (highest first),
    service bands, submissions."""

    neg_level: int
    band: int
    submitted_at: float
    trial_id: int


class TenantKey(NamedTuple):
    """The order in which tenants are served: owed first, then patient, then borrowing; among
    borrowers the least attained service of their next trial (``borrow_by_service``); then
    the lowest fair-share score; then the tenant's next group (:class:`HeadKey`)."""

    standing: int  # 0 owed its guarantee, 1 patient (below it, waits), 2 borrowing
    # borrowers (borrow_by_service): the service band of the tenant's next trial; else 0
    service: int
    score: float
    neg_level: int
    band: int
    submitted_at: float
    trial_id: int


def entitled(used: int, size: int, guarantee: int) -> bool:
    """Whether a trial counts against its tenant's guarantee (and may reclaim for it).

    It does while the tenant holds less than its guarantee, whatever the trial's size: a gang
    cannot be split, so a tenant below its guarantee may go past it by its next trial (as a
    YARN queue below its capacity gets its next container whatever its size), once.
    """
    del size  # the rule is about what the tenant holds; kept for the call sites' clarity
    return used < guarantee


class _Group:
    """Queued trials of one tenant, priority and shape; ``trials[at]`` is the next one."""

    __slots__ = ("at", "band", "done", "head", "priority", "shape", "trials")

    def __init__(self, priority: int, shape: Shape, trials: Run) -> None:
        self.priority = priority
        self.shape = shape
        self.trials = trials
        self.at = 0
        # blocked or exhausted for this pass
        self.done = False
        self.head = trials.first
        # the policy's order key starts with the band (FairSharePolicy._order_key)
        self.band = int(trials.first_key[0])

    def advance(self) -> bool:
        """Move to the next trial; False when the group is exhausted."""
        self.at += 1
        if self.at == len(self.trials):
            return False
        self.head = self.trials[self.at]
        self.band = int(self.trials.key_at(self.at)[0])
        return True


_NO_BAND = 1 << 30


@dataclass
class _Tenant:
    name: str
    share: TenantShare
    used: int
    usage_slots: float
    groups: list[_Group]
    # (key of the group's head, tie-breaker, group); stale entries are skipped
    heap: list[tuple[HeadKey, int, _Group]] = field(default_factory=list)


class FairSharePolicy(BasePolicy):
    """Guarantees, limits and weights per tenant; fair share on decayed usage; priorities with
    aging and least-attained-service inside a tenant; gang placement; EASY backfill;
    preemption to restore guarantees and to let short trials past long ones."""

    name = "fair"

    def __init__(self, config: FairShareConfig | None = None) -> None:
        self.config = config or FairShareConfig()
        self.rules = PreemptionRules(
            min_run_time_s=self.config.min_run_time_s,
            cooldown_s=self.config.preemption_cooldown_s,
            max_victims=self.config.max_preemptions_per_pass,
            service_thresholds_slot_s=self.config.service_thresholds_slot_s,
            cooldown_growth=self.config.cooldown_growth,
            fewest_preemptions_first=self.config.victim_fewest_preemptions,
            time_left_s=self.config.victim_time_left_s,
        )
        self.queue_order = QueueOrder("fair", self._order_key)
        if self.config.patience_share is not None:
            self.standing_half_life_s = self.config.standing_half_life_s
        # victims by the time they have left; queued trials' only to backfill by them
        self.reads_queued_durations = self.config.estimates_for_backfill
        self.reads_running_durations = self.config.victim_time_left_s > 0
        # a cache of per-trial facts for victim choice; never changes a decision
        self.victim_facts = VictimFacts(self.rules)
        self.claim_memo = ClaimMemo()
        # the reclaim budgets (ADR 0036): per tenant (or one under None, with
        # reclaim_budget_per_tenant off), the slots its reclaims may still preempt and when
        # that was counted; a tenant without an entry has a full budget
        self.reclaim_budgets: dict[str | None, tuple[float, float]] = {}
        # the last (shares, cluster slots) -> scaled shares, note: shares rarely change
        self._scaled: (
            tuple[Mapping[str, TenantShare], int, Mapping[str, TenantShare], str | None] | None
        ) = None

    def _order_key(self, trial: QueuedTrial) -> OrderKey:
        return (float(self.rules.band(trial.attained_service)), trial.submitted_at, trial.trial_id)

    def decide(self, snapshot: Snapshot) -> DecisionList:
        return _FairPass(self, snapshot).run()

    def effective_shares(
        self, shares: Mapping[str, TenantShare], pool: NodePool
    ) -> tuple[Mapping[str, TenantShare], str | None]:
        """``shares`` with guarantees scaled to the cluster's slots, and the note saying so."""
        total = pool.total_slots()
        memo = self._scaled
        if memo is not None and memo[0] is shares and memo[1] == total:
            return memo[2], memo[3]
        guarantees = {t: s.guaranteed_slots for t, s in shares.items()}
        note = guarantee_note(guarantees, total)
        if note is None:
            result: tuple[Mapping[str, TenantShare], str | None] = (shares, None)
        else:
            scaled = scaled_guarantees(guarantees, total)
            result = (
                {t: replace(s, guaranteed_slots=scaled[t]) for t, s in shares.items()},
                note,
            )
        self._scaled = (shares, total, result[0], result[1])
        return result


class _FairPass:
    """The state of one decision of :class:`FairSharePolicy`."""

    def __init__(self, policy: FairSharePolicy, snapshot: Snapshot) -> None:
        self.policy = policy
        self.config = policy.config
        self.rules = policy.rules
        self.snapshot = snapshot
        self.now = snapshot.now
        self.running = RunningTable.coerce(snapshot.running)
        self.raw = NodePool(snapshot.nodes, self.config.hot_gpu_temperature_c)
        self.backfill: NodePool | None = None
        self.book = ReasonBook(snapshot.nodes, self.raw)
        self.preemptor: Preemptor | None = None
        self.reservation: Reservation | None = None
        self.unmet_claim = False
        self.failed_claims = 0
        # when a reclaim budget lets a claim refused for it through (ADR 0036)
        self.budget_wake: float | None = None
        # tenants whose first blocked trial holds a reservation (reserve_every_owed)
        self.reserved_for: set[str] = set()
        self.starts: list[Start] = []
        self.preempts: list[Preempt] = []
        self.pending: list[Pending] = []
        self.lazy: list[tuple[Sequence[QueuedTrial], int, Reason]] = []
        self.heap: list[tuple[TenantKey, str]] = []
        queue = TrialQueue.coerce(snapshot.queue, policy.queue_order)
        # guarantees that add up to more than the cluster are scaled down to fit it
        self.shares, self.scaled_note = policy.effective_shares(snapshot.tenants, self.raw)
        # GPU counts say nothing about trials without GPUs: never stop early when some wait
        self.cpu_only = any(not group.shape.gpus_per_worker for group in queue.groups)
        self.tenants = self._tenants(queue)

    def _tenants(self, queue: TrialQueue) -> dict[str, _Tenant]:
        tau = mean_life_s(self.config.half_life_s)
        used = self.running.slots_by_tenant
        shares = self.shares
        usage = self.snapshot.tenant_usage
        default = TenantShare()
        tenants: dict[str, _Tenant] = {}
        for (name, neg_rank, shape), trials in queue.groups.items():
            tenant = tenants.get(name)
            if tenant is None:
                tenant = _Tenant(
                    name,
                    shares.get(name, default),
                    used.get(name, 0),
                    usage.get(name, 0.0) / tau,
                    [],
                )
                tenants[name] = tenant
            tenant.groups.append(_Group(-neg_rank, shape, trials))
        return tenants

    # -- order -------------------------------------------------------------------------------

    def _level(self, group: _Group) -> int:
        """The group head's priority after aging."""
        interval = self.config.aging_interval_s
        if interval <= 0:
            return group.priority
        waited = self.now - group.head.queued_at
        return group.priority + max(0, math.floor(waited / interval))

    def _group_key(self, group: _Group) -> HeadKey:
        head = group.head
        return HeadKey(-self._level(group), group.band, head.submitted_at, head.trial_id)

    def _top(self, tenant: _Tenant) -> tuple[HeadKey, _Group] | None:
        """The tenant's group whose head goes next (dropping stale heap entries)."""
        heap = tenant.heap
        while heap:
            key, _, group = heap[0]
            if group.done or key.trial_id != group.head.trial_id:
                heapq.heappop(heap)
                continue
            return key, group
        return None

    def _push(self, tenant: _Tenant) -> None:
        top = self._top(tenant)
        if top is None:
            return
        key, group = top
        size = group.head.request.num_slots
        borrowing = 2 * int(not entitled(tenant.used, size, tenant.share.guaranteed_slots))
        if not borrowing and not self._owed(tenant):
            borrowing = 1  # patient: after the tenants owed their guarantee, before borrowers
        score = (tenant.usage_slots + tenant.used) / tenant.share.weight
        service = key.band if borrowing == 2 and self.config.borrow_by_service else 0
        heapq.heappush(self.heap, (TenantKey(borrowing, service, score, *key), tenant.name))

    # -- the pass ----------------------------------------------------------------------------

    def run(self) -> DecisionList:
        # every group's key (:meth:`_group_key`, inlined: hundreds of groups per pass)
        now, interval, floor = self.now, self.config.aging_interval_s, math.floor
        for tenant in self.tenants.values():
            heap = []
            for i, g in enumerate(tenant.groups):
                head = g.head
                level = g.priority
                if interval > 0:
                    waited = (now - head.queued_at) / interval
                    if waited >= 1:
                        level += floor(waited)
                heap.append((HeadKey(-level, g.band, head.submitted_at, head.trial_id), i, g))
            heapq.heapify(heap)
            tenant.heap = heap
            self._push(tenant)
        while self.heap:
            if self._exhausted():
                break
            _, name = heapq.heappop(self.heap)
            tenant = self.tenants[name]
            top = self._top(tenant)
            if top is None:
                continue
            if self._visit(tenant, top[1]):
                break
        behind = None
        if self.reservation is not None:
            behind = behind_reason(self.reservation.trial_id)
        for tenant in self.tenants.values():
            for group in tenant.groups:
                if group.done:
                    continue
                request = group.head.request
                waiting: Reason
                if behind is not None and (
                    not self.config.backfill or self.raw.total_free >= request.num_slots
                ):
                    # it might fit the free GPUs, which the head's reservation holds
                    waiting = self.book.unless_never(request, group.shape, behind)
                else:
                    waiting = self.book.of_group("waiting", request, group.shape)
                self.lazy.append((group.trials, group.at, waiting))
        wake_at = self.preemptor.wake_at if self.preemptor and self.unmet_claim else None
        if self.budget_wake is not None and (wake_at is None or self.budget_wake < wake_at):
            wake_at = self.budget_wake

        return DecisionList(self.starts, self.preempts, self.pending, self.lazy, wake_at)

    def _visit(self, tenant: _Tenant, group: _Group) -> bool:
        """Decide for the head of ``group``; True ends the pass (head blocked, no backfill)."""
        trial = group.head
        request = trial.request
        size = request.num_slots
        limit = tenant.share.limit_slots
        if limit is not None and tenant.used + size > limit:
            unit = "GPUs" if request.gpus_per_worker else "CPUs"
            text = limit_reason(limit, tenant.used, unit)
            return self._block(tenant, group, text, text)
        ranks, short = self._place(trial, request, size)
        if ranks is not None:
            self.starts.append(Start(trial.trial_id, ranks))
            self.raw.take(request, ranks)
            if self.backfill is not None:
                self.backfill.take(request, ranks, against_caps=not short)
            self.book.started(request, ranks)
            tenant.used += size
            return self._advance(tenant, group)
        if not self.raw.fits_empty(request, group.shape):
            never = self.book.of_group("never", request, group.shape)
            return self._block(tenant, group, never, never)
        if self.config.preemption and self.failed_claims < self.config.max_failed_claims_per_pass:
            claimed = self._claim(tenant, group)
            if claimed is not None:
                self.pending.append(Pending(trial.trial_id, claimed))
                return self._advance(tenant, group)
            self.unmet_claim = True
            self.failed_claims += 1
            gpu_bound = group.head.request.gpus_per_worker > 0
            if self.reservation is not None and gpu_bound and self._usable() == 0:
                # nothing can start, and the tenant's best trial cannot preempt: its other
                # trials wait this pass without being looked at one by one
                return self._block(tenant, group, self._busy(group), self._busy(group), whole=True)
        if self.reservation is None:
            if self.raw.total_free == 0 and not self.cpu_only and not self.running.preempting:
                # no GPU is free and none is about to be: nothing can start behind the head in
                # this decision, so where it will start is left to the next one
                self.reservation = Reservation(trial.trial_id, (), {}, None)
                self.backfill = self.raw
                head_reason = self.book.prefixed("next in line" + self._patience_note(tenant, size))
            else:
                self.reservation = reserve(
                    trial,
                    self.raw,
                    self.running,
                    self.now,
                    known_ends=self.config.estimates_for_backfill,
                )
                self.backfill = self.raw.copy(self.reservation.caps)
                head_reason = self.book.prefixed(
                    self.reservation.describe(self.now) + self._patience_note(tenant, size)
                )
            self.reserved_for.add(tenant.name)
            self._block(tenant, group, head_reason, behind_reason(trial.trial_id))
            return not self.config.backfill
        if (
            self.config.reserve_every_owed
            and request.gpus_per_worker
            and tenant.name not in self.reserved_for
            and entitled(tenant.used, size, tenant.share.guaranteed_slots)
            and self.backfill is not None
            and self.backfill.total_free > 0
        ):
            return self._reserve_more(tenant, group)
        if self.raw.total_free >= size or not request.gpus_per_worker:
            text = behind_reason(self.reservation.trial_id)
            return self._block(tenant, group, text, text)
        return self._block(tenant, group, self._busy(group), self._busy(group))

    def _reserve_more(self, tenant: _Tenant, group: _Group) -> bool:
        """A reservation for the first blocked trial of a tenant below its guarantee when
        another trial holds the pass's first one: backfill keeps off its nodes too, so an
        owed gang is not starved by trials that take each GPU as it frees (ADR 0036)."""
        trial = group.head
        if self.backfill is self.raw:
            self.backfill = self.raw.copy()
        pool = self.backfill
        assert pool is not None
        extra = reserve(
            trial, pool, self.running, self.now, known_ends=self.config.estimates_for_backfill
        )
        need: dict[str, int] = {}
        for node in extra.ranks:
            need[node] = need.get(node, 0) + trial.request.gpus_per_worker
        pool.restrict({node: max(0, pool.usable(node) - gpus) for node, gpus in need.items()})
        self.reserved_for.add(tenant.name)
        size = trial.request.num_slots
        reason = self.book.prefixed(extra.describe(self.now) + self._patience_note(tenant, size))
        self._block(tenant, group, reason, behind_reason(trial.trial_id))
        return False

    def _place(
        self, trial: QueuedTrial, request: ResourceRequest, size: int
    ) -> tuple[tuple[str, ...] | None, bool]:
        """Where the trial starts now without delaying the reservation; (ranks, ends before
        the reservation starts)."""
        # total_free counts GPUs: a quick "cannot fit" only for requests that need GPUs
        if request.gpus_per_worker and self.raw.total_free < size:
            return None, False
        if self.backfill is None:
            return self.raw.place(request), False
        ranks = self.backfill.place(request)
        if ranks is not None:
            return ranks, False
        assert self.reservation is not None
        start_at = self.reservation.start_at
        duration = trial.expected_duration_s if self.config.estimates_for_backfill else None
        if start_at is not None and duration is not None and self.now + duration <= start_at:
            return self.raw.place(request), True
        return None, False

    def _exhausted(self) -> bool:
        """No GPU left to start anything on and no preemption left to try: the rest waits."""
        if self.reservation is None or self._usable() > 0 or self.cpu_only:
            return False
        if self.reservation.start_at is not None and self.raw.total_free > 0:
            return False  # a trial known to end before the head starts may still fit
        if not self.config.preemption:
            return True
        return self.failed_claims >= self.config.max_failed_claims_per_pass or (
            self.preemptor is not None and self.preemptor.spent
        )

    def _usable(self) -> int:
        pool = self.backfill if self.backfill is not None else self.raw
        return pool.total_free

    def _busy(self, group: _Group) -> Reason:
        return self.book.of_group("busy", group.head.request, group.shape)

    def _advance(self, tenant: _Tenant, group: _Group) -> bool:
        if group.advance():
            heapq.heappush(tenant.heap, (self._group_key(group), id(group), group))
        else:
            group.done = True
        self._push(tenant)
        return False

    def _block(
        self, tenant: _Tenant, group: _Group, reason: Reason, rest: Reason, whole: bool = False
    ) -> bool:
        """The group's head waits for ``reason``, the rest of the group for ``rest``; with
        ``whole`` the tenant's other groups wait too (for their own busy reason)."""
        group.done = True
        self.lazy.append(((group.head,), 0, reason))
        if group.at + 1 < len(group.trials):
            self.lazy.append((group.trials, group.at + 1, rest))
        if whole:
            for other in tenant.groups:
                if not other.done:
                    other.done = True
                    waiting = self.book.of_group("waiting", other.head.request, other.shape)
                    self.lazy.append((other.trials, other.at, waiting))
            return False
        self._push(tenant)
        return False

    def _owed(self, tenant: _Tenant) -> bool:
        """Whether a tenant below its guarantee may preempt for it now: always without
        patience or without a standing; else only when its surplus over ``patience_share`` of
        its entitlement no longer covers ``patience_horizon_s`` of its present shortfall."""
        share = self.config.patience_share
        standing = self.snapshot.tenant_standing.get(tenant.name)
        if share is None or standing is None:
            return True
        shortfall = max(0, tenant.share.guaranteed_slots - tenant.used)
        return standing.surplus_slot_s(share) < shortfall * self.config.patience_horizon_s

    def _patience_note(self, tenant: _Tenant, size: int) -> str:
        """Why a tenant below its guarantee waits instead of preempting (or nothing)."""
        guarantee = tenant.share.guaranteed_slots
        if not self.config.preemption or not entitled(tenant.used, size, guarantee):
            return ""
        standing = self.snapshot.tenant_standing.get(tenant.name)
        if standing is None or self._owed(tenant) or not standing.entitled_slot_s:
            return ""
        got = standing.received_slot_s / standing.entitled_slot_s
        return (
            f" (tenant {tenant.name} has received {got:.0%} of its guarantee recently, so it "
            f"waits for GPUs that free on their own instead of preempting; it preempts "
            f"when it nears {self.config.patience_share:.0%})"
        )

    # -- preemption --------------------------------------------------------------------------

    def _budget_params(self, tenant: _Tenant) -> tuple[str | None, float, float, float]:
        """(key, level, ceiling, refill per second) of the reclaim budget ``tenant`` spends,
        in slots: its own, sized by its guarantee and refilling at least at
        ``reclaim_floor_slots_per_h``, or with ``reclaim_budget_per_tenant`` off the one of the
        cluster."""
        rate = self.config.reclaim_rate_share_per_h
        assert rate is not None
        key: str | None
        if self.config.reclaim_budget_per_tenant:
            key, base = tenant.name, tenant.share.guaranteed_slots
            # the floor: a tenant's budget refills at least this fast whatever its size
            per_h = max(rate * base, self.config.reclaim_floor_slots_per_h)
        else:
            key, base = None, self.raw.total_slots()
            per_h = rate * base
        ceiling = max(1.0, self.config.reclaim_burst_share * base)
        per_s = per_h / 3600.0
        stored = self.policy.reclaim_budgets.get(key)
        if stored is None:
            return key, ceiling, ceiling, per_s
        level, at = stored
        return key, min(ceiling, level + per_s * max(0.0, self.now - at)), ceiling, per_s

    def _reclaim_budget(self, tenant: _Tenant) -> float:
        """Slots ``tenant``'s reclaims may still preempt in this decision (infinite: no
        bound, or a full budget, which lets one claim through whatever its size)."""
        if self.config.reclaim_rate_share_per_h is None:
            return math.inf
        _, level, ceiling, _ = self._budget_params(tenant)
        return math.inf if level >= ceiling else level

    def _spend(self, tenant: _Tenant, slots: int) -> None:
        if self.config.reclaim_rate_share_per_h is None:
            return
        key, level, _, _ = self._budget_params(tenant)
        self.policy.reclaim_budgets[key] = (level - slots, self.now)

    def _budget_wait(self, tenant: _Tenant) -> None:
        """A claim found victims beyond ``tenant``'s budget: decide again once it is full."""
        _, level, ceiling, per_s = self._budget_params(tenant)
        if per_s <= 0:
            return
        at = self.now + max(1.0, (ceiling - level) / per_s)
        if self.budget_wake is None or at < self.budget_wake:
            self.budget_wake = at

    def _hold(self, request: ResourceRequest, free_part: Mapping[str, int]) -> None:
        """Set aside for a claimant the free GPUs its placement counts on beside those its
        victims free: no trial later in the pass takes them, or the claimant would still
        not fit once its victims left and would preempt again (ADR 0042)."""
        g = request.gpus_per_worker
        if not g:
            return
        for node, gpus in free_part.items():
            ranks = gpus / g
            cpus, memory = -ranks * request.cpus_per_worker, -ranks * request.memory_gb_per_worker
            self.raw.adjust(node, -gpus, cpus, memory)
            if self.backfill is not None and self.backfill is not self.raw:
                self.backfill.adjust(node, -gpus, cpus, memory)

    def _claim(self, tenant: _Tenant, group: _Group) -> str | None:
        """Preempt for the group's head if the rules allow it; its pending reason, or None."""
        if self.preemptor is None:
            self.preemptor = Preemptor(
                running=self.running,
                shares=self.shares,
                used=self.running.slots_by_tenant,
                now=self.now,
                rules=self.rules,
                facts=self.policy.victim_facts,
                memo=self.policy.claim_memo,
            )
            self.policy.claim_memo.bind(self.running, self.raw.total_free)
        preemptor = self.preemptor
        trial = group.head
        size = trial.request.num_slots
        guarantee = tenant.share.guaranteed_slots
        pool = self.backfill if self.backfill is not None else self.raw
        if preemptor.incoming_suffices(trial, pool):
            self._hold(trial.request, preemptor.free_part)
            tenant.used += size
            return "starts when the trials being preempted for it have checkpointed and exited"
        if entitled(tenant.used, size, guarantee) and self._owed(tenant):
            overshoot = 0
            if self.config.gang_overshoot:
                # what the gang goes past the guarantee, if no more than what the tenant is
                # still owed (at least half the gang is within the guarantee)
                past = tenant.used + size - guarantee
                if 0 < past <= guarantee - tenant.used:
                    overshoot = past
            budget = self._reclaim_budget(tenant)
            victims = preemptor.reclaim(trial, pool, overshoot, budget)
            if victims is None and preemptor.over_budget:
                self._budget_wait(tenant)
            if victims is not None:
                self._spend(tenant, sum(v.request.num_slots for v in victims))
                self._hold(trial.request, preemptor.free_part)
                tenant.used += size
                held = self.running.slots_by_tenant
                lenders = {
                    v.tenant
                    for v in victims
                    if held.get(v.tenant, 0)
                    > self.shares.get(v.tenant, TenantShare()).guaranteed_slots
                }
                self.preempts.extend(
                    Preempt(
                        v.trial_id,
                        f"tenant {v.tenant} is above its guarantee and tenant {tenant.name} "
                        f"reclaims its guaranteed {guarantee} GPUs"
                        if v.tenant in lenders
                        else f"tenant {tenant.name}, below its guarantee of {guarantee} GPUs, "
                        f"runs a gang that needs it {overshoot} GPU(s) past it; tenant "
                        f"{v.tenant} gives up to as many below its own guarantee",
                    )
                    for v in victims
                )
                ids = ", ".join(str(v.trial_id) for v in victims)
                note = f" ({self.scaled_note})" if self.scaled_note else ""
                borrowed = all(v.tenant in lenders for v in victims)
                kind = "borrowed trial(s)" if borrowed else "trial(s)"
                return (
                    f"reclaiming the tenant's guaranteed {guarantee} GPUs{note}: preempting "
                    f"{kind} {ids}, which checkpoint first"
                )
        by_service = self.config.displace_by_service and self.rules.service_thresholds_slot_s
        if by_service or trial.priority.rank:
            # without displacement by service no band is low enough to displace anyone
            band = group.band if by_service else _NO_BAND
            victims = preemptor.displace(trial, band, pool)
            if victims is not None:
                self._hold(trial.request, preemptor.free_part)
                tenant.used += size - sum(v.request.num_slots for v in victims)
                self.preempts.extend(
                    Preempt(
                        v.trial_id,
                        f"trial {trial.trial_id} of the same tenant has a higher priority or "
                        "less attained service",
                    )
                    for v in victims
                )
                ids = ", ".join(str(v.trial_id) for v in victims)
                return (
                    f"preempting trial(s) {ids} of the same tenant (lower priority or more "
                    "attained service), which checkpoint first"
                )
        return None
