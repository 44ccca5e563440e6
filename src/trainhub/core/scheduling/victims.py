"""What is known about the running trials a preemption could take, kept between decisions.

A decision that preempts needs, for each tenant, the trials that may be preempted now (past
their minimum run time and cool-down), their attained-service band and the work a preemption
would lose. Those change only when the tenant's running trials change or when a protection or
band ends, so :class:`VictimFacts` keeps them per tenant until then, and :class:`ClaimMemo`
keeps the claims that failed while nothing they depend on changed. Both are caches held by the
policy object: the decisions do not depend on them, only their cost does.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from trainhub.core.scheduling.runningtable import RunningTable
from trainhub.core.scheduling.snapshot import RunningTrial


@dataclass(frozen=True)
class PreemptionRules:
    min_run_time_s: float
    cooldown_s: float
    max_victims: int
    # attained service (slot-seconds) that ends each band; empty: no displacement by service
    service_thresholds_slot_s: tuple[float, ...] = ()
    # the cool-down after the n-th preemption is cooldown_s * cooldown_growth ** (n - 1)
    cooldown_growth: float = 1.0
    # lenders' victims: those preempted fewest times first (before least work at risk)
    fewest_preemptions_first: bool = False
    # lenders' victims expected to end within this many seconds go after the others (0: off)
    time_left_s: float = 0.0

    def band(self, attained_slot_s: float) -> int:
        return bisect.bisect_right(self.service_thresholds_slot_s, attained_slot_s)


# a running trial's work at risk and lender order, fixed for its attempt: (slots, checkpoint
# base, checkpoint period, priority rank, earlier preemptions)
Risk = tuple[int, float, float | None, int, int]
# (eligible_at, trial id, trial, ...): plain tuple order is the order of eligibility (ids
# are unique, so the comparison never reaches the trial)
Facts = tuple[float, int, RunningTrial, int, float, float, float, float | None, int, Risk]


class VictimFacts:
    """What a pass needs of each running trial that does not change during its attempt, per
    tenant, kept between passes while the tenant's running trials stay the same (a cache: the
    policy's answers do not depend on it)."""

    def __init__(self, rules: PreemptionRules) -> None:
        self._rules = rules
        self._tenants: dict[str, tuple[tuple[RunningTrial, ...], list[Facts], list[float]]] = {}
        self._states: dict[str, tuple[tuple[RunningTrial, ...], TenantVictims]] = {}
        self._spread: dict[int, tuple[RunningTrial, list[tuple[str, int]], int]] = {}
        self._facts: dict[int, Facts] = {}

    def spread(self, trial: RunningTrial) -> list[tuple[str, int]]:
        """(node, GPUs) the trial holds, per node."""
        known = self._spread.get(trial.trial_id)
        if known is None or known[0] is not trial:
            per: dict[str, int] = {}
            for node in trial.placement:
                per[node] = per.get(node, 0) + trial.request.gpus_per_worker
            known = (trial, list(per.items()), max(per.values(), default=0))
            if len(self._spread) > 100_000:
                self._spread.clear()
            self._spread[trial.trial_id] = known
        return known[1]

    def of(self, tenant: str, trials: tuple[RunningTrial, ...]) -> tuple[list[Facts], list[float]]:
        """(eligible_at, trial id, trial, slots, attained, started_at, checkpoint base, period,
        rank, risk) of the preemptible trials, by the time they may be preempted; and those
        times."""
        cached = self._tenants.get(tenant)
        if cached is not None and cached[0] is trials:
            return cached[1], cached[2]
        rules = self._rules
        known = self._facts
        facts: list[Facts] = []
        for trial in trials:
            if trial.preempting or not trial.preemptible:
                continue
            # a trial's facts are fixed for its attempt: most tenants change by a few trials
            seen = known.get(trial.trial_id)
            if seen is not None and seen[2] is trial:
                facts.append(seen)
                continue
            protect = rules.min_run_time_s
            if trial.num_preemptions:
                cooldown = rules.cooldown_s * rules.cooldown_growth ** (trial.num_preemptions - 1)
                protect = max(protect, cooldown)
            base = (
                trial.started_at if trial.last_checkpoint_at is None else trial.last_checkpoint_at
            )
            slots = trial.request.num_slots
            rank = trial.priority.rank
            fact = (
                trial.started_at + protect,
                trial.trial_id,
                trial,
                slots,
                trial.attained_service,
                trial.started_at,
                base,
                trial.checkpoint_every_s,
                rank,
                (slots, base, trial.checkpoint_every_s, rank, trial.num_preemptions),
            )
            if len(known) > 100_000:
                known.clear()
            known[trial.trial_id] = fact
            facts.append(fact)
        facts.sort()
        eligible = [f[0] for f in facts]
        self._tenants[tenant] = (trials, facts, eligible)
        return facts, eligible

    def victims(self, tenant: str, trials: tuple[RunningTrial, ...], now: float) -> TenantVictims:
        """The tenant's victims at ``now``; reused by later passes until something changes."""
        cached = self._states.get(tenant)
        if cached is not None and cached[0] is trials and cached[1].since <= now < cached[1].until:
            return cached[1]
        facts, eligible = self.of(tenant, trials)
        split = bisect.bisect_right(eligible, now)
        thresholds = self._rules.service_thresholds_slot_s
        until = facts[split][0] if split < len(facts) else math.inf
        ready: list[RunningTrial] = []
        band: dict[int, int] = {}
        risk: dict[int, Risk] = {}
        lowest_rank, highest_band = 10**9, -1
        bands = len(thresholds)
        bisect_right = bisect.bisect_right
        for i in range(split):
            _, trial_id, trial, slots, attained, started, _, _, rank, at_risk = facts[i]
            level = bisect_right(thresholds, attained + slots * (now - started))
            if level < bands and slots:
                ends = started + (thresholds[level] - attained) / slots
                if ends < until:  # noqa: PLR1730 (a hot loop: no call)
                    until = ends
            band[trial_id] = level
            risk[trial_id] = at_risk
            ready.append(trial)
            if rank < lowest_rank:  # noqa: PLR1730 (a hot loop: no call)
                lowest_rank = rank
            if level > highest_band:  # noqa: PLR1730 (a hot loop: no call)
                highest_band = level
        state = TenantVictims(
            ready=ready,
            young=[(f[0], f[2]) for f in facts[split:]],
            band=band,
            risk=risk,
            weakest=(lowest_rank, highest_band) if ready else None,
            since=now,
            until=until,
        )
        self._states[tenant] = (trials, state)
        return state


@dataclass
class TenantVictims:
    """Who of one tenant may be preempted, valid from ``since`` until ``until`` (the next time
    a trial passes its protection or a service band)."""

    ready: list[RunningTrial]
    young: list[tuple[float, RunningTrial]]
    band: dict[int, int]
    # trial id -> (slots, checkpoint base, checkpoint period, priority rank, preemptions): the
    # work at risk at any time and the lender order
    risk: dict[int, Risk]
    weakest: tuple[int, int] | None
    since: float
    until: float
    # victim orders, made on first use and kept with the state (the work at risk they sort by
    # is the one at ``since``: a cache, slightly stale until the state is renewed)
    as_lender: Candidates | None = None
    as_own: Candidates | None = None


class ClaimMemo:
    """Claims that failed, remembered across decisions while what they depend on is unchanged:
    the running trials they looked at (the same tuples of the snapshot's ``RunningTable``), no
    more free GPUs than then, and no protection or band ending since. Such a claim would fail
    again, so later decisions skip it. A cache for speed: a claim it skips could at most have
    found victims on GPUs that moved between nodes, and is tried again once anything it
    depends on changes."""

    def __init__(self) -> None:
        # claimant tenant -> (smallest failed size, its overshoot, until, every tenant's running
        # trials, free): a claim no smaller with no more overshoot fails too
        self._reclaim: dict[str, tuple[int, int, float, tuple[object, ...], int]] = {}
        # (tenant, priority rank, band) -> (until, the tenant's running trials, free)
        self._displace: dict[tuple[str, int, int], tuple[float, object, int]] = {}
        self._running: RunningTable | None = None
        self._free = 0

    def bind(self, running: RunningTable, free_gpus: int) -> None:
        self._running = running
        self._free = free_gpus

    def _everyone(self) -> tuple[object, ...]:
        assert self._running is not None
        return tuple(self._running.by_tenant.values())

    @staticmethod
    def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
        return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))

    def reclaim_fails(self, tenant: str, size: int, overshoot: int, now: float) -> bool:
        known = self._reclaim.get(tenant)
        if (
            known is None
            or size < known[0]
            or overshoot > known[1]
            or now >= known[2]
            or self._free > known[4]
        ):
            return False
        return self._same(self._everyone(), known[3])

    def reclaim_failed(self, tenant: str, size: int, overshoot: int, until: float) -> None:
        known = self._reclaim.get(tenant)
        everyone = self._everyone()
        if (
            known is None
            or size < known[0]
            or overshoot > known[1]
            or not self._same(known[3], everyone)
        ):
            self._reclaim[tenant] = (size, overshoot, until, everyone, self._free)

    def displace_fails(self, key: tuple[str, int, int], now: float) -> bool:
        known = self._displace.get(key)
        if known is None or now >= known[0] or self._free > known[2]:
            return False
        assert self._running is not None
        return self._running.by_tenant.get(key[0]) is known[1]

    def displace_failed(self, key: tuple[str, int, int], until: float) -> None:
        assert self._running is not None
        self._displace[key] = (until, self._running.by_tenant.get(key[0]), self._free)


class Candidates:
    """Victim candidates in preference order, with their GPUs per node, for one pass."""

    def __init__(self, trials: list[RunningTrial], facts: VictimFacts) -> None:
        known = facts._spread
        # (trial, (node, GPUs) per node, the most GPUs it holds on one node)
        items: list[tuple[RunningTrial, list[tuple[str, int]], int]] = []
        most = 0
        for trial in trials:
            seen = known.get(trial.trial_id)
            if seen is None or seen[0] is not trial:
                facts.spread(trial)
                seen = known[trial.trial_id]
            items.append((trial, seen[1], seen[2]))
            if seen[2] > most:  # noqa: PLR1730 (a hot loop: no call)
                most = seen[2]
        self.items = items
        # the most GPUs one candidate holds on one node
        self.most_gpus = most
